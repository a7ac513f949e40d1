"""Training on a ballast dataset version with PyTorch Lightning. Imports nothing heavy."""
