from grpo_runtime.openmp import prefer_passive_openmp


def test_sets_passive_wait_when_unset():
    environ = {"PATH": "/bin"}
    assert prefer_passive_openmp(environ) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert environ == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}


def test_keeps_the_operators_policy():
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert prefer_passive_openmp(environ) == {}
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}
