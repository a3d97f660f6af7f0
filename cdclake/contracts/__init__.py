"""The contracts, each written once: events and batches, names, column types, the wire
protocol, the watermark, Debezium envelopes. Pure Python over msgspec; imports nothing else of
cdclake but its own modules.
"""
