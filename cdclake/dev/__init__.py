"""The local stack and what runs on it: the embedded services (``cdclake up``), the demo
(``cdclake demo``) and its workload, and the reference model the demo and the tests check the
tables against. No product layer imports this package (tests/project/test_import_graph.py).
"""
