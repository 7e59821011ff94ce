"""RLlib's column names for episode and batch data (``ray.rllib.core.columns``)."""

from __future__ import annotations

__all__ = ["Columns"]


class Columns:
    """String constants naming the data columns that modules, connectors and batches share."""

    OBS = "obs"
    INFOS = "infos"
    ACTIONS = "actions"
    ACTIONS_FOR_ENV = "actions_for_env"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    NEXT_OBS = "new_obs"
    EPS_ID = "eps_id"
    AGENT_ID = "agent_id"
    MODULE_ID = "module_id"
    SEQ_LENS = "seq_lens"
    T = "t"
    STATE_IN = "state_in"
    STATE_OUT = "state_out"
    EMBEDDINGS = "embeddings"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    ACTION_PROB = "action_prob"
    ACTION_LOGP = "action_logp"
    VF_PREDS = "vf_preds"
    VALUES_BOOTSTRAPPED = "values_bootstrapped"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    LOSS_MASK = "loss_mask"
