"""placeholder"""
def add_sweep_args(p): pass
def run_sweep(a, c): pass
