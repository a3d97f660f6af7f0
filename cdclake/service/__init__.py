"""What the two HTTP services (receiver, REST catalog) share: Prometheus metrics, JSON logs,
connection limits, and the rule for listening off loopback.
"""
