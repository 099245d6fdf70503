"""Every setting of fedsv, declared once (schema), and the run's settings (RunConfig) built from them."""
