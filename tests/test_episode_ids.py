"""``new_episode_id``: 32 hex digits, unique, and never shared with a forked child."""

from __future__ import annotations

import os
import re

import pytest

from envrunners.env import _episode_ids
from envrunners.env._episode_ids import new_episode_id
from envrunners.env.multi_agent_episode import MultiAgentEpisode


def test_ids_are_32_hex_digits_and_unique():
    ids = [new_episode_id() for _ in range(1000)]  # several refills of the pool
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    ep = MultiAgentEpisode(observations=[{0: 1}], agent_to_module_mapping_fn=lambda a, e: "m")
    assert re.fullmatch(r"[0-9a-f]{32}", ep.id_)
    assert re.fullmatch(r"[0-9a-f]{32}", ep.agent_episodes[0].id_)
    assert ep.agent_episodes[0].id_ != ep.id_


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_does_not_reuse_the_parents_pool():
    _episode_ids._pool.clear()  # (else the call may take an earlier test's last pooled id)
    new_episode_id()  # the pool now holds ids
    parent_pool = set(_episode_ids._pool)
    assert parent_pool
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        os.write(w, new_episode_id().encode())
        os._exit(0)
    os.close(w)
    child_id = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert re.fullmatch(r"[0-9a-f]{32}", child_id)
    assert child_id not in parent_pool
