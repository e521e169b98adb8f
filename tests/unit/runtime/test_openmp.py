import pytest

from grpo_runtime.openmp import shared_core_openmp


def test_shortens_the_spin_when_the_environment_sets_none():
    environ = {"PATH": "/bin"}
    assert shared_core_openmp(environ) == {"GOMP_SPINCOUNT": "100000"}
    assert environ == {"PATH": "/bin", "GOMP_SPINCOUNT": "100000"}


@pytest.mark.parametrize("operator", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}])
def test_keeps_the_operators_policy_or_spin_count(operator):
    environ = dict(operator)
    assert shared_core_openmp(environ) == {}
    assert environ == operator
