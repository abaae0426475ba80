import pytest

from lmpo.algos import Registry, UnknownNameError


def test_register_get_names_contains():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        return "b"

    @reg.register("a")
    def a():
        return "a"

    assert reg.get("a") is a and reg.get("b")() == "b"
    assert reg.names() == ["a", "b"]
    assert "a" in reg and "c" not in reg and 3 not in reg


def test_unknown_name_message_and_types():
    reg = Registry("advantage estimator")
    for name in ("rloo", "grpo", "dr_grpo"):
        reg.register(name)(lambda: None)
    with pytest.raises(UnknownNameError) as info:
        reg.get("foo")
    assert str(info.value) == "unknown advantage estimator 'foo'; choose one of: dr_grpo, grpo, rloo"
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_duplicate_registration_rejected():
    reg = Registry("widget")
    reg.register("x")(lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x")(lambda: None)


def test_unregister_returns_the_function_and_forgets_the_name():
    from lmpo.algos.registry import Registry, UnknownNameError

    reg = Registry("thing")
    reg.register("a")(len)
    assert reg.unregister("a") is len and "a" not in reg
    with pytest.raises(UnknownNameError, match="unknown thing 'a'"):
        reg.unregister("a")
