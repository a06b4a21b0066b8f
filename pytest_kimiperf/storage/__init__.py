"""Storage: what the judge's histories are loaded from and saved to. The baseline file end to end
(its JSON, read, locked, replaced atomically, merged between runners) and the checkout's git facts;
the judge gets their contents as immutable values, loaded once, and never opens a file itself
(tests/unit/test_architecture.py).

Which module holds what: docs/explanation/architecture.md (the one module map).
"""
