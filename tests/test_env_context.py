"""EnvContext (spec §2): a dict of env_config keys plus the identity of the env copy."""

from __future__ import annotations

import copy
import pickle

from envrunners.env.env_context import EnvContext


def test_constructor_defaults_and_dict_behaviour():
    config = {"size": 4}
    ctx = EnvContext(config, worker_index=2)
    assert isinstance(ctx, dict)
    assert ctx == {"size": 4} and ctx["size"] == 4
    assert (ctx.worker_index, ctx.vector_index, ctx.remote) == (2, 0, False)
    assert (ctx.num_workers, ctx.recreated_worker) == (None, False)
    ctx["extra"] = 1
    assert config == {"size": 4}  # the context holds a copy of the keys


def test_all_attributes_positionally():
    ctx = EnvContext({}, 1, 3, True, 4, True)
    assert (ctx.worker_index, ctx.vector_index, ctx.remote) == (1, 3, True)
    assert (ctx.num_workers, ctx.recreated_worker) == (4, True)


def test_copy_with_overrides_replaces_only_given_args():
    ctx = EnvContext({"a": 1}, worker_index=1, vector_index=0, remote=False, num_workers=2)
    sub = ctx.copy_with_overrides(vector_index=3)
    assert isinstance(sub, EnvContext) and sub is not ctx
    assert sub == {"a": 1}
    assert (sub.worker_index, sub.vector_index, sub.remote, sub.num_workers) == (1, 3, False, 2)
    assert ctx.vector_index == 0
    sub["b"] = 2
    assert "b" not in ctx
    other = ctx.copy_with_overrides(
        worker_index=5, remote=True, num_workers=7, recreated_worker=True
    )
    assert (other.worker_index, other.remote, other.num_workers, other.recreated_worker) == (
        5,
        True,
        7,
        True,
    )


def test_copy_with_overrides_deep_copies_a_given_env_config():
    new_config = {"nested": [1, 2]}
    ctx = EnvContext({"a": 1}, worker_index=0).copy_with_overrides(env_config=new_config)
    assert ctx == {"nested": [1, 2]}
    ctx["nested"].append(3)
    assert new_config == {"nested": [1, 2]}


def test_set_defaults_adds_only_missing_keys():
    ctx = EnvContext({"a": 1}, worker_index=0)
    ctx.set_defaults({"a": 99, "b": 2})
    assert ctx == {"a": 1, "b": 2}


def test_str_shows_worker_vector_and_remote():
    ctx = EnvContext({"a": 1}, worker_index=2, vector_index=1, remote=True, num_workers=3)
    assert str(ctx) == "{'a': 1, worker=2/3, vector_idx=1, remote=True}"
    assert str(EnvContext({}, 0)) == "{, worker=0/None, vector_idx=0, remote=False}"


def test_union_with_a_dict_is_a_plain_dict():
    merged = EnvContext({"a": 1}, worker_index=1) | {"num_envs": 4}
    assert type(merged) is dict and merged == {"a": 1, "num_envs": 4}


def test_pickle_and_deepcopy_keep_attributes():
    ctx = EnvContext({"a": [1]}, worker_index=3, vector_index=2, num_workers=4)
    for clone in (pickle.loads(pickle.dumps(ctx)), copy.deepcopy(ctx)):
        assert isinstance(clone, EnvContext) and clone == ctx
        assert (clone.worker_index, clone.vector_index, clone.num_workers) == (3, 2, 4)
