"""pytest settings of byteps-mxnet's tests."""


def pytest_configure(config):
    # mxnet 1.9 itself looks up scipy.sparse.csr.csr_matrix, which scipy deprecated: not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:Please use `csr_matrix`:DeprecationWarning")
