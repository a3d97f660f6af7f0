"""Tests of the receiver: the door (bodies, limits, names, hostile input), the wire protocol, durable landing."""
