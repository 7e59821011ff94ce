"""The field table of ``AlgorithmConfig``: every key's name, type, default, builder and check.

Why: one declaration per key is the single source of truth for defaults
(``AlgorithmConfig()``), for which builder method accepts it (``sections``), for
its set-time check, and for ``to_dict``/``from_dict``. It is data: ``FIELDS``
below, read by ``AlgorithmConfig``. Defaults follow RLlib 2.60 (spec §1) with one
deliberate difference, marked below.

Subclasses (e.g. ``PPOConfig``) extend the table by declaring annotated class
attributes (:func:`extend_fields`); they become keys of the ``training()`` section
unless declared with :func:`config_field`. Redeclaring an inherited key only
changes its default.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from envrunners.algorithms import _config_checks as c
from envrunners.core import DEFAULT_POLICY_ID
from envrunners.policy.policy_spec import PolicySpec

__all__ = ["FIELDS", "ConfigField", "config_field", "default_policy_mapping_fn"]

ENV, RUN, FT, MA = "environment", "env_runners", "fault_tolerance", "multi_agent"
OFF, MOD, TRAIN, LRN = "offline_data", "rl_module", "training", "learners"
FW, DBG, CBS, REP, EVAL = "framework", "debugging", "callbacks", "reporting", "evaluation"
RES, EXPL, CKPT, EXP, PYENV = (
    "resources",
    "exploration",
    "checkpointing",
    "experimental",
    "python_environment",
)


@dataclasses.dataclass(frozen=True)
class ConfigField:
    """One config key: its name, type, default, the builder(s) that set it, and its check.

    Args:
        name: Attribute name on the config.
        type: The value's type (documentation; checks are done by ``check``).
        default: Default value; every new config gets a deep copy.
        sections: Name(s) of the builder methods that accept this key
            (``()`` for keys only set by attribute or ``update_from_dict``).
        check: ``check(name, value) -> value`` run whenever the key is set.
        kwarg: The builder keyword when it differs from the attribute name
            (``framework_str`` is set by ``framework(framework=...)``).
    """

    name: str
    type: Any
    default: Any
    sections: str | tuple[str, ...] = TRAIN
    check: c.Check = c.any_value
    kwarg: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sections, str):
            object.__setattr__(self, "sections", (self.sections,))

    @property
    def keyword(self) -> str:
        """The builder keyword that sets this key."""
        return self.kwarg or self.name

    def new_default(self) -> Any:
        """A fresh copy of the default, so configs never share a mutable default."""
        return copy.deepcopy(self.default)


def config_field(
    default: Any,
    sections: str | tuple[str, ...] = TRAIN,
    check: c.Check = c.any_value,
    *,
    kwarg: str | None = None,
) -> ConfigField:
    """Declare a key in a config subclass: ``lambda_: float = config_field(1.0, TRAIN, check)``.

    Why: a subclass key whose builder or check is not the default (``training()``,
    any value); the name and type come from the annotation (see :func:`extend_fields`).
    """
    return ConfigField("", Any, default, sections, check, kwarg)


def default_policy_mapping_fn(agent_id: Any, episode: Any = None, worker: Any = None, **kwargs):
    """Map every agent to ``"default_policy"`` (the single-agent setup).

    Why: the default of ``policy_mapping_fn``; accepts both the new-stack call
    ``(agent_id, episode)`` and the old-stack call ``(agent_id, episode, worker, **kw)``.
    """
    return DEFAULT_POLICY_ID


_f = ConfigField
_pos_int, _nonneg_int = c.integer(1), c.integer(0)
_pos_int_or_none = c.integer(1, allow_none=True)
_nonneg_num, _pos_num = c.number(0.0), c.number(0.0, strict=True)
_nonneg_num_or_none = c.number(0.0, allow_none=True)
_pos_num_or_none = c.number(0.0, strict=True, allow_none=True)
_B, _D, _CB = c.boolean, c.mapping, c.callback_functions

#: Every key of ``AlgorithmConfig``, grouped by the builder method that sets it.
FIELDS: tuple[ConfigField, ...] = (
    # --- environment() ---
    _f("env", Any, None, ENV, c.env),
    _f("env_config", dict, {}, ENV, _D),
    _f("observation_space", Any, None, ENV, c.space),
    _f("action_space", Any, None, ENV, c.space),
    _f("render_env", bool, False, ENV, _B),
    _f("clip_rewards", bool | float | None, None, ENV),
    _f("normalize_actions", bool, True, ENV, _B),
    _f("clip_actions", bool, False, ENV, _B),
    _f("disable_env_checking", bool, False, ENV, _B),
    _f("is_atari", bool | None, None, ENV),
    _f("action_mask_key", str, "action_mask", ENV, c.optional_string),
    # --- env_runners() ---
    _f("env_runner_cls", type | None, None, RUN, c.optional_class),
    _f("num_env_runners", int, 0, RUN, _nonneg_int),
    _f("create_local_env_runner", bool, True, RUN, _B),
    _f("create_env_on_local_worker", bool, False, RUN, _B),
    _f("num_envs_per_env_runner", int, 1, RUN, _pos_int),
    _f("gym_env_vectorize_mode", str, "sync", RUN, c.vectorize_mode),
    _f("num_cpus_per_env_runner", float, 1, RUN, _nonneg_num),
    _f("num_gpus_per_env_runner", float, 0, RUN, _nonneg_num),
    _f("custom_resources_per_env_runner", dict, {}, RUN, _D),
    _f("validate_env_runners_after_construction", bool, True, RUN, _B),
    _f("sample_timeout_s", float | None, 60.0, RUN, _pos_num_or_none),
    _f("max_requests_in_flight_per_env_runner", int, 1, RUN, _pos_int),
    # envrunners key (RLlib has none; its IMPALA/APPO always sample this way): the remote
    # runners keep sampling while the driver trains (``execution/_continuous_sampling``),
    # with max_requests_in_flight_per_env_runner as the staleness bound in weight versions.
    _f("sample_continuously", bool, False, RUN, _B),
    _f("env_to_module_connector", Callable | None, None, RUN, c.optional_callable),
    _f("module_to_env_connector", Callable | None, None, RUN, c.optional_callable),
    _f("add_default_connectors_to_env_to_module_pipeline", bool, True, RUN, _B),
    _f("add_default_connectors_to_module_to_env_pipeline", bool, True, RUN, _B),
    _f("episode_lookback_horizon", int, 1, RUN, _nonneg_int),
    # envrunners' own (RLlib has no such keys): ready-first stepping of an asynchronous
    # backend ("envpool", "shared_memory"); the runner checks them against the backend.
    _f("ready_first_batch_size", int | None, None, RUN, _pos_int_or_none),
    _f("overlap_inference", bool | str, "auto", RUN, c.choice(True, False, "auto")),
    # envrunners' own: young garbage collections wait while a runner samples (utils/gc_pause).
    _f("pause_gc_during_sample", bool, True, RUN, _B),
    _f("merge_env_runner_states", bool | str, "training_only", RUN, c.merge_env_runner_states),
    _f("broadcast_env_runner_states", bool, True, RUN, _B),
    _f("use_env_runner_state_server", bool, False, RUN, _B),
    _f("env_runner_state_server_max_concurrency", int, 16, RUN, _pos_int),
    _f("compress_observations", bool | str, False, RUN),
    _f("rollout_fragment_length", int | str, 200, RUN, c.rollout_fragment_length),
    _f(
        "batch_mode",
        str,
        "truncate_episodes",
        RUN,
        c.choice("truncate_episodes", "complete_episodes"),
    ),
    _f("explore", bool, True, (RUN, EXPL), _B),
    _f("episodes_to_numpy", bool, True, RUN, _B),
    _f("use_worker_filter_stats", bool, True, RUN, _B),
    _f("update_worker_filter_stats", bool, True, RUN, _B),
    _f("exploration_config", dict, {}, (RUN, EXPL), _D),
    _f("remote_worker_envs", bool, False, RUN, _B),
    _f("remote_env_batch_wait_ms", float, 0, RUN, _nonneg_num),
    _f("preprocessor_pref", str | None, "deepmind", RUN, c.optional_string),
    _f("observation_filter", Any, "NoFilter", RUN, c.observation_filter),
    _f("sampler_perf_stats_ema_coef", float | None, None, RUN, _nonneg_num_or_none),
    _f("sync_filters_on_rollout_workers_timeout_s", float, 10.0, RUN, _nonneg_num),
    # --- fault_tolerance() ---
    _f("restart_failed_env_runners", bool, True, FT, _B),
    _f("ignore_env_runner_failures", bool, False, FT, _B),
    _f("max_num_env_runner_restarts", int, 1000, FT, c.integer(-1)),
    # DELIBERATE DIFFERENCE: RLlib waits 60 s before a failed runner exits to be
    # restarted (pain point: users wait a minute per fault); we default to 1 s.
    _f("delay_between_env_runner_restarts_s", float, 1.0, FT, _nonneg_num),
    _f("restart_failed_sub_environments", bool, False, FT, _B),
    _f("num_consecutive_env_runner_failures_tolerance", int, 100, FT, _nonneg_int),
    _f("env_runner_health_probe_timeout_s", float, 30.0, FT, _nonneg_num),
    _f("env_runner_restore_timeout_s", float, 1800.0, FT, _nonneg_num),
    # envrunners key (RLlib has none): a runner whose call misses its deadline is out of
    # service at once; it is replaced (killed, restarted or swapped for the standby) when
    # that call is still running this many deadlines after it was sent.
    _f("replace_env_runner_after_missed_deadlines", int, 2, FT, _pos_int),
    # --- multi_agent() ---
    _f("policies", dict[str, PolicySpec], {DEFAULT_POLICY_ID: PolicySpec()}, MA, c.policies),
    _f("policy_map_capacity", int, 100, MA, _pos_int),
    _f("policy_mapping_fn", Callable, default_policy_mapping_fn, MA, c.optional_callable),
    _f("policies_to_train", Any, None, MA, c.policies_to_train),
    _f("policy_states_are_swappable", bool, False, MA, _B),
    _f("observation_fn", Callable | None, None, MA, c.optional_callable),
    _f("count_steps_by", str, "env_steps", MA, c.choice("env_steps", "agent_steps")),
    # --- offline_data() ---
    _f("input_", Any, "sampler", OFF, c.input_),
    _f("input_config", dict, {}, OFF, _D),
    _f("actions_in_input_normalized", bool, False, OFF, _B),
    _f("postprocess_inputs", bool, False, OFF, _B),
    _f("shuffle_buffer_size", int, 0, OFF, _nonneg_int),
    _f("output", Any, None, OFF, c.output),
    _f("output_config", dict, {}, OFF, _D),
    _f("output_compress_columns", list[str], ["obs", "new_obs"], OFF),
    _f("output_max_file_size", int, 64 * 1024 * 1024, OFF, _pos_int),
    _f("offline_sampling", bool, False, OFF, _B),
    # new-stack offline data (OfflineData, OfflineSingleAgentEnvRunner); RLlib 2.60 defaults
    _f("input_read_method", str, "read_parquet", OFF, c.optional_string),
    _f("input_read_method_kwargs", dict, {}, OFF, _D),
    _f("input_read_episodes", bool, False, OFF, _B),
    _f("input_read_batch_size", int | None, None, OFF, _pos_int_or_none),
    _f("input_compress_columns", list[str], ["obs", "new_obs"], OFF),
    _f("map_batches_kwargs", dict, {}, OFF, _D),
    _f("iter_batches_kwargs", dict, {}, OFF, _D),
    _f("dataset_num_iters_per_learner", int | None, None, OFF, _pos_int_or_none),
    _f("output_write_episodes", bool, True, OFF, _B),
    _f("output_max_rows_per_file", int | None, None, OFF, _pos_int_or_none),
    _f("output_write_remaining_data", bool, False, OFF, _B),
    _f("output_write_method", str, "write_parquet", OFF, c.optional_string),
    _f("output_write_method_kwargs", dict, {}, OFF, _D),
    # --- rl_module() ---
    _f("model_config", dict, dict(c.MODEL_DEFAULTS), MOD, c.model_config),
    _f("rl_module_spec", Any, None, MOD),
    _f("algorithm_config_overrides_per_module", dict, {}, (MOD, MA), _D),
    # --- training() (and learners()) ---
    _f("gamma", float, 0.99, TRAIN, _nonneg_num),
    _f("lr", float | list, 0.001, TRAIN, c.learning_rate),
    _f("grad_clip", float | None, None, TRAIN, _nonneg_num_or_none),
    _f("grad_clip_by", str, "global_norm", TRAIN, c.choice("value", "norm", "global_norm")),
    _f("train_batch_size", int, 4000, TRAIN, _pos_int),
    _f("train_batch_size_per_learner", int | None, None, TRAIN, _pos_int_or_none),
    _f("num_epochs", int, 1, TRAIN, _pos_int),
    _f("minibatch_size", int | None, None, TRAIN, _pos_int_or_none),
    _f("shuffle_batch_per_epoch", bool, False, TRAIN, _B),
    _f("optimizer", dict, {}, TRAIN, _D),
    _f("learner_class", type | None, None, (TRAIN, LRN), c.optional_class),
    _f("learner_connector", Callable | None, None, (TRAIN, LRN), c.optional_callable),
    _f("add_default_connectors_to_learner_pipeline", bool, True, (TRAIN, LRN), _B),
    _f("learner_config_dict", dict, {}, (TRAIN, LRN), _D),
    _f("num_aggregator_actors_per_learner", int, 0, (TRAIN, LRN), _nonneg_int),
    _f("max_requests_in_flight_per_aggregator_actor", int, 3, (TRAIN, LRN), _pos_int),
    _f("num_learners", int, 0, LRN, _nonneg_int),
    _f("num_cpus_per_learner", float | str, "auto", LRN),
    _f("num_gpus_per_learner", float, 0, LRN, _nonneg_num),
    _f("custom_resources_per_learner", dict, {}, LRN, _D),
    _f("local_gpu_idx", int, 0, LRN, _nonneg_int),
    _f("max_requests_in_flight_per_learner", int, 3, LRN, _pos_int),
    # --- framework() ---
    _f("framework_str", str, "torch", FW, c.framework, kwarg="framework"),
    _f("torch_compile_learner", bool, False, FW, _B),
    _f("torch_compile_learner_what_to_compile", str, "forward_train", FW),
    _f("torch_compile_learner_dynamo_backend", str, "inductor", FW),
    _f("torch_compile_learner_dynamo_mode", str | None, None, FW),
    _f("torch_compile_worker", bool, False, FW, _B),
    _f("torch_compile_worker_dynamo_backend", str, "onnxrt", FW),
    _f("torch_compile_worker_dynamo_mode", str | None, None, FW),
    _f("torch_ddp_kwargs", dict, {}, FW, _D),
    _f("torch_skip_nan_gradients", bool, False, FW, _B),
    # --- api_stack() ---
    _f("enable_rl_module_and_learner", bool, True, "api_stack", _B),
    _f("enable_env_runner_and_connector_v2", bool, True, "api_stack", _B),
    # --- debugging() ---
    _f("log_level", str, "WARN", DBG, c.log_level),
    _f("log_sys_usage", bool, True, DBG, _B),
    _f("fake_sampler", bool, False, DBG, _B),
    _f("seed", int | None, None, DBG, c.seed),
    # --- callbacks() ---
    _f("callbacks_class", list[type], [], CBS, c.callbacks_class),
    _f("callbacks_on_algorithm_init", list | None, None, CBS, _CB, kwarg="on_algorithm_init"),
    _f("callbacks_on_train_result", list | None, None, CBS, _CB, kwarg="on_train_result"),
    _f("callbacks_on_evaluate_start", list | None, None, CBS, _CB, kwarg="on_evaluate_start"),
    _f("callbacks_on_evaluate_end", list | None, None, CBS, _CB, kwarg="on_evaluate_end"),
    _f(
        "callbacks_on_env_runners_recreated",
        list | None,
        None,
        CBS,
        _CB,
        kwarg="on_env_runners_recreated",
    ),
    _f("callbacks_on_checkpoint_loaded", list | None, None, CBS, _CB, kwarg="on_checkpoint_loaded"),
    _f(
        "callbacks_on_environment_created",
        list | None,
        None,
        CBS,
        _CB,
        kwarg="on_environment_created",
    ),
    _f("callbacks_on_episode_created", list | None, None, CBS, _CB, kwarg="on_episode_created"),
    _f("callbacks_on_episode_start", list | None, None, CBS, _CB, kwarg="on_episode_start"),
    _f("callbacks_on_episode_step", list | None, None, CBS, _CB, kwarg="on_episode_step"),
    _f("callbacks_on_episode_end", list | None, None, CBS, _CB, kwarg="on_episode_end"),
    _f("callbacks_on_sample_end", list | None, None, CBS, _CB, kwarg="on_sample_end"),
    # --- reporting() ---
    _f("keep_per_episode_custom_metrics", bool, False, REP, _B),
    _f("metrics_episode_collection_timeout_s", float, 60.0, REP, _nonneg_num),
    _f("metrics_num_episodes_for_smoothing", int, 100, REP, _pos_int),
    _f("min_time_s_per_iteration", float | None, None, REP, _nonneg_num_or_none),
    _f("min_train_timesteps_per_iteration", int, 0, REP, _nonneg_int),
    _f("min_sample_timesteps_per_iteration", int, 0, REP, _nonneg_int),
    _f("log_gradients", bool, False, REP, _B),
    _f("custom_stats_cls_lookup", dict, {}, REP, _D),
    # --- evaluation() ---
    _f("evaluation_interval", int | None, None, EVAL, c.integer(0, allow_none=True)),
    _f("evaluation_duration", int | str, 10, EVAL, c.int_or_auto(1)),
    _f("evaluation_duration_unit", str, "episodes", EVAL, c.choice("episodes", "timesteps")),
    _f("evaluation_auto_duration_min_env_steps_per_sample", int, 100, EVAL, _pos_int),
    _f("evaluation_auto_duration_max_env_steps_per_sample", int, 2000, EVAL, _pos_int),
    _f("evaluation_sample_timeout_s", float, 120.0, EVAL, _pos_num),
    _f("evaluation_parallel_to_training", bool, False, EVAL, _B),
    _f("evaluation_force_reset_envs_before_iteration", bool, True, EVAL, _B),
    _f("evaluation_config", Any, None, EVAL, c.evaluation_config),
    _f("off_policy_estimation_methods", dict, {}, EVAL, _D),
    _f("ope_split_batch_by_episode", bool, True, EVAL, _B),
    _f("evaluation_num_env_runners", int, 0, EVAL, _nonneg_int),
    _f("custom_evaluation_function", Callable | None, None, EVAL, c.optional_callable),
    _f("in_evaluation", bool, False, (), _B),  # set on evaluation copies, not by a builder
    # --- resources() ---
    _f("num_gpus", float, 0, RES, _nonneg_num),
    _f("_fake_gpus", bool, False, RES, _B),
    _f("num_cpus_for_main_process", float, 1, RES, _nonneg_num),
    _f("custom_resources_for_main_process", dict, {}, RES, _D),
    _f(
        "placement_strategy",
        str,
        "PACK",
        RES,
        c.choice("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
    ),
    # --- checkpointing(), python_environment() ---
    _f("export_native_model_files", bool, False, CKPT, _B),
    _f("checkpoint_trainable_policies_only", bool, False, CKPT, _B),
    _f("extra_python_environs_for_driver", dict, {}, PYENV, _D),
    _f("extra_python_environs_for_worker", dict, {}, PYENV, _D),
    # --- experimental() ---
    _f("_validate_config", bool, True, EXP, _B),
    _f("_use_msgpack_checkpoints", bool, False, EXP, _B),
    _f("_torch_grad_scaler_class", type | None, None, EXP, c.optional_class),
    _f("_torch_lr_scheduler_classes", Any, None, EXP),
    _f("_disable_preprocessor_api", bool, False, EXP, _B),
    _f("_disable_action_flattening", bool, False, EXP, _B),
    _f("_disable_initialize_loss_from_dummy_batch", bool, False, EXP, _B),
    _f("_dont_auto_sync_env_runner_states", bool, False, (), _B),
)


def extend_fields(
    inherited: Mapping[str, ConfigField],
    annotations: Mapping[str, Any],
    namespace: Mapping[str, Any],
) -> dict[str, ConfigField]:
    """Return the table of a config subclass: ``inherited`` plus its class-body declarations.

    Why: algorithm configs add keys by plain annotated class attributes. An
    annotated name with a :func:`config_field` value is declared as given; with a
    plain value it is a new ``training()`` key, or, if inherited, keeps its builder
    and check and only changes its default. A plain (unannotated) class attribute
    naming an inherited key (``lr = 5e-5``) also only changes the default.
    """
    fields = dict(inherited)
    for name, value in namespace.items():
        declared = value if isinstance(value, ConfigField) else None
        if name not in annotations and (declared is None and name not in inherited):
            continue
        if declared is not None:
            fields[name] = dataclasses.replace(declared, name=name, type=annotations.get(name, Any))
        elif name in inherited:
            fields[name] = dataclasses.replace(inherited[name], default=value)
        else:
            fields[name] = ConfigField(name, annotations[name], value)
    return fields


def builder_keywords(fields: Mapping[str, ConfigField]) -> dict[str, dict[str, str]]:
    """Return ``{builder section: {keyword: attribute name}}`` for ``fields``."""
    keywords: dict[str, dict[str, str]] = {}
    for field in fields.values():
        for section in field.sections:
            keywords.setdefault(section, {})[field.keyword] = field.name
    return keywords


# Old key name -> (new key name, builder sections that still accept the old name).
RENAMED: dict[str, tuple[str, tuple[str, ...]]] = {
    "num_workers": ("num_env_runners", (RUN,)),
    "num_rollout_workers": ("num_env_runners", (RUN,)),
    "num_envs_per_worker": ("num_envs_per_env_runner", (RUN,)),
    "create_env_on_driver": ("create_env_on_local_worker", (RUN,)),
    "validate_workers_after_construction": ("validate_env_runners_after_construction", (RUN,)),
    "num_cpus_per_worker": ("num_cpus_per_env_runner", (RUN, RES)),
    "num_gpus_per_worker": ("num_gpus_per_env_runner", (RUN, RES)),
    "custom_resources_per_worker": ("custom_resources_per_env_runner", (RUN, RES)),
    "max_requests_in_flight_per_sampler_worker": (
        "max_requests_in_flight_per_env_runner",
        (TRAIN, RUN),
    ),
    "num_cpus_for_local_worker": ("num_cpus_for_main_process", (RES,)),
    "num_cpus_for_driver": ("num_cpus_for_main_process", (RES,)),
    "num_learner_workers": ("num_learners", (RES, LRN)),
    "num_cpus_per_learner_worker": ("num_cpus_per_learner", (RES, LRN)),
    "num_gpus_per_learner_worker": ("num_gpus_per_learner", (RES, LRN)),
    "recreate_failed_workers": ("restart_failed_env_runners", (FT, RUN)),
    "recreate_failed_env_runners": ("restart_failed_env_runners", (FT,)),
    "ignore_worker_failures": ("ignore_env_runner_failures", (FT, RUN)),
    "max_num_worker_restarts": ("max_num_env_runner_restarts", (FT,)),
    "delay_between_worker_restarts_s": ("delay_between_env_runner_restarts_s", (FT,)),
    "num_consecutive_worker_failures_tolerance": (
        "num_consecutive_env_runner_failures_tolerance",
        (FT, RUN),
    ),
    "worker_health_probe_timeout_s": ("env_runner_health_probe_timeout_s", (FT, RUN)),
    "worker_restore_timeout_s": ("env_runner_restore_timeout_s", (FT, RUN)),
    "evaluation_num_workers": ("evaluation_num_env_runners", (EVAL,)),
    "num_sgd_iter": ("num_epochs", (TRAIN,)),
    "sgd_minibatch_size": ("minibatch_size", (TRAIN,)),
    "model_config_dict": ("model_config", (MOD,)),
}
# Keys that moved to another builder but keep their name (accepted with a warning).
MOVED: dict[str, tuple[str, ...]] = {"restart_failed_sub_environments": (RUN,)}
# RLlib keys that only configure TensorFlow: accepted with a warning, then ignored.
TF_ONLY = frozenset(
    {"eager_tracing", "eager_max_retraces", "tf_session_args", "local_tf_session_args",
     "enable_tf1_exec_eagerly", "_tf_policy_handles_more_than_one_loss"}
)  # fmt: skip
# RLlib keys outside envrunners' scope: a ConfigError says so instead of "unknown".
UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(
        ["offline_data_class", "input_read_schema", "input_read_sample_batches",
         "input_filesystem", "input_filesystem_kwargs", "materialize_data",
         "materialize_mapped_data", "ignore_final_observation", "prelearner_class",
         "prelearner_buffer_class", "prelearner_buffer_kwargs", "prelearner_module_synch_period",
         "prelearner_use_recorded_module_states", "output_filesystem", "output_filesystem_kwargs",
         "offline_evaluation_interval", "num_offline_eval_runners", "offline_evaluation_type",
         "offline_eval_runner_class", "offline_loss_for_module_fn",
         "offline_eval_batch_size_per_runner", "dataset_num_iters_per_offline_eval_runner",
         "offline_eval_rl_module_inference_only", "num_cpus_per_offline_eval_runner",
         "num_gpus_per_offline_eval_runner", "custom_resources_per_offline_eval_runner",
         "offline_evaluation_timeout_s", "max_requests_in_flight_per_offline_eval_runner",
         "broadcast_offline_eval_runner_states", "validate_offline_eval_runners_after_construction",
         "restart_failed_offline_eval_runners", "ignore_offline_eval_runner_failures",
         "max_num_offline_eval_runner_restarts", "offline_eval_runner_health_probe_timeout_s",
         "offline_eval_runner_restore_timeout_s", "on_evaluate_offline_start",
         "on_evaluate_offline_end", "on_offline_eval_runners_recreated"],
        "offline RL training, remote filesystems and offline evaluation are out of scope",
    ),
    **dict.fromkeys(
        ["sample_collector", "synchronize_filter", "enable_connectors", "replay_mode",
         "policy_map_cache", "_enable_rl_module_api", "env_task_fn",
         "evaluation_unhealthy_workers_timeout_s", "evaluation_error_after_n_consecutive_skips",
         "always_attach_evaluation_results"],
        "it is deprecated in RLlib and has no effect here",
    ),
}  # fmt: skip
# RLlib keys that envrunners stores (RLlib configs and dicts carry them) but has no code
# for: ``validate()`` refuses any value but the default, naming the reason.
UNSUPPORTED_VALUES: dict[str, str] = {
    "torch_compile_learner": "torch.compile is not applied to the learners' modules",
    "torch_compile_worker": "torch.compile is not applied to the env runners' modules",
    "torch_ddp_kwargs": "learners run in the driver process, without DistributedDataParallel",
    "custom_resources_per_learner": "learners run in the driver process, not as Ray actors",
    "num_aggregator_actors_per_learner": "there are no aggregator actors",
    "use_env_runner_state_server": "env runner states are synced directly, without a server",
    "learner_connector": "the learners build their batches themselves (no learner pipeline)",
    "add_default_connectors_to_learner_pipeline": (
        "the learners build their batches themselves (no learner pipeline to leave empty)"
    ),
    "_torch_grad_scaler_class": "the learners train in full precision (no grad scaler)",
    "_torch_lr_scheduler_classes": "the learners take lr schedules only as lr=[[t, lr], ...]",
    "_fake_gpus": "there is no fake-GPU mode",
}

# dict-style key (RLlib's to_dict / old dict configs) <-> attribute name.
DICT_KEYS = {
    "framework_str": "framework",
    "input_": "input",
    "callbacks_class": "callbacks",
    "lambda_": "lambda",
}
