"""Analysis: records in, tables and figures out. Never loads a model or imports torch.

``report`` (per-config summary against ``ar``), ``compare`` (the one comparison against ``ar``), ``fit``
(the paper's scaling law), ``tables`` (paper Tables 2 and 3 beside ours), ``uncertainty`` (bootstrap
intervals), ``steps`` (a decoder's steps by tokens fed: which kind pays), ``plots`` (matplotlib
figures), ``io`` (Markdown, CSV, PNG, CLI shape).
"""
