"""What a running worker serves besides jobs: the metrics port and its probes, Prometheus
text, and systemd's notifications."""
