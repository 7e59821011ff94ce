"""RLlib 2.60's user-visible behaviour where envrunners used to differ (issue 15, items 2-4).

Each test pins what real RLlib does on the same snippet: the exception class a user
catches, and the values returned; our messages (did-you-mean hints) are kept.
"""

from __future__ import annotations

import pytest

from envrunners import errors


# -- envrunners.utils.error at RLlib's path --------------------------------------------------
def test_utils_error_path_has_rllibs_classes_and_texts():
    from envrunners.utils import error

    for name in ("EnvError", "MultiAgentEnvError", "UnsupportedSpaceException", "NotSerializable"):
        cls = getattr(error, name)
        assert cls is getattr(errors, name)
        assert issubclass(cls, Exception) and issubclass(cls, errors.EnvRunnersError)
    # The existing multi-agent protocol error is RLlib's class at its path.
    assert error.MultiAgentEnvError is errors.MultiAgentEnvError
    assert issubclass(error.EnvError, ValueError)
    assert "The env string you provided ('Foo-v0') is:" in (
        error.ERR_MSG_INVALID_ENV_DESCRIPTOR.format("Foo-v0")
    )
    assert error.ERR_MSG_NO_GPUS.startswith("Found {} GPUs on your machine")
    for name in (
        "ERR_MSG_OLD_GYM_API",
        "ERR_MSG_TF_POLICY_CANNOT_SAVE_KERAS_MODEL",
        "ERR_MSG_TORCH_POLICY_CANNOT_SAVE_MODEL",
        "HOWTO_CHANGE_CONFIG",
    ):
        assert isinstance(getattr(error, name), str)
    with pytest.raises(error.EnvError, match="bad env"):
        raise error.EnvError("bad env")
