"""The model's life after training: scoring, evaluation, drift, the champion, the one
promotion rule, registration and rollback."""
