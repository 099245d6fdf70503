"""The paper's empirical study (noisy labels, backdoors, data summarization) run through `fedsv launch`.

Modules: config (StudyConfig), runner (launches), detection (curves, areas), summarization (dismissal),
detection_study / summarize_study (the studies), outputs (CSV, JSON, figures), study (run_study), cli.
"""
