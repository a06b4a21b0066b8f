"""Judgement: is this build's figure a real change or noise, and does the test pass? It starts
nothing, sends no request, opens no file and prints nothing: it judges the values storage/ loaded
(tests/unit/test_architecture.py checks it).

Which module holds what: docs/explanation/architecture.md (the one module map).
"""
