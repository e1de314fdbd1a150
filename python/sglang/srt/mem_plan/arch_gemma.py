"""(being written: see arch_spec.py)"""

ARCHS: tuple = ()
