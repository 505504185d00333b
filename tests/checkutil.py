"""Shared by the self-check tests: run a check without raising and assert how it failed."""


def fails(check, fn, *match, **kwargs):
    """Run ``check(fn)``; assert it failed and that its message contains every ``match``."""
    result = check(fn, raise_on_fail=False, **kwargs)
    assert not result.passed, result.message
    for m in match:
        assert m in result.message, result.message
    return result
