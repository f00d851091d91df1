"""The cross-check: every registry function's two twins against each other and against finite
differences, stage by stage, on seeded cases (`python -m crosscheck`)."""
