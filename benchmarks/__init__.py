"""The project's benchmarks (``billing bench``, ``billing bench-listener``): tools, not the product.

They need the optional ``bench`` dependencies (``pip install 'billing-pipeline[bench]'``).
"""
