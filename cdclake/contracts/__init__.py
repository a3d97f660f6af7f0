"""The wire contracts, each written once: events and batches, names, column types, the wire
protocol, the watermark, a table's system columns. Pure Python over msgspec; imports nothing else
of cdclake but its own modules.
"""
