"""Split reader, profile export, embedded MoE engine, harness and ds4 launcher."""
