"""Operations (DESIGN.md section 10): the Prometheus exporter, the queue view, usage, the config check."""
