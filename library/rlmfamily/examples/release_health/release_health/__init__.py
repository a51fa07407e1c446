"""A release-health report from deployment events (the journey's example project)."""
