"""Provider wire formats: one package per dialect, pure translation apart from I/O."""
