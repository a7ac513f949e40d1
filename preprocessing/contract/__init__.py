"""The dataset contract: all that training/ and tracking/ may import (manifest, codec,
secrets, faults)."""
