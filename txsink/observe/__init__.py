"""Observe: what txsink tells people and machines while it runs.

Logging (the epoch and sink uid on every record, the console line per epoch), the
one-paragraph failure, a client library's outages rate-limited, the driver's side of the
metrics hook (metering), and the Prometheus and OpenTelemetry exporters.

May import: the base API and the kit. Everything above uses it (the protocol logs and
meters; connectors log through :mod:`txsink.observe.logs`); it never reads the txsink log
(following a log from another process is an operator tool: :mod:`txsink.ops.follow`).
"""
