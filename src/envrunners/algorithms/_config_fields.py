"""The typed field table of ``AlgorithmConfig``: every key, its type, default and setter.

Why: one declaration per key is the single source of truth for defaults
(``AlgorithmConfig()``), for which builder method accepts it (``sections``), for
its set-time check, and for ``to_dict``/``from_dict``. Defaults follow RLlib 2.60
(spec §1) with one deliberate difference, marked below.

Subclasses (e.g. ``PPOConfig``) add keys by declaring annotated class attributes;
they become fields of the ``training()`` section unless declared with
:func:`config_field`. Redeclaring an inherited key only changes its default.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any, ClassVar

from envrunners.algorithms import _config_checks as c
from envrunners.core import DEFAULT_POLICY_ID
from envrunners.policy.policy_spec import PolicySpec

__all__ = ["config_field", "default_policy_mapping_fn"]


def default_policy_mapping_fn(agent_id: Any, episode: Any = None, worker: Any = None, **kwargs):
    """Map every agent to ``"default_policy"`` (the single-agent setup).

    Why: the default of ``policy_mapping_fn``; accepts both the new-stack call
    ``(agent_id, episode)`` and the old-stack call ``(agent_id, episode, worker, **kw)``.
    """
    return DEFAULT_POLICY_ID


def config_field(
    default: Any,
    sections: str | tuple[str, ...] = "training",
    check: c.Check = c.any_value,
    *,
    kwarg: str | None = None,
) -> Any:
    """Declare a config key: its default, the builder(s) that set it, and its check.

    Why: keeps all metadata of a key on its one declaration line.

    Args:
        default: Default value; mutable values are deep-copied per config.
        sections: Name(s) of the builder methods that accept this key
            (``()`` for keys only set by attribute or ``update_from_dict``).
        check: ``check(name, value) -> value`` run whenever the key is set.
        kwarg: The builder keyword when it differs from the attribute name
            (``framework_str`` is set by ``framework(framework=...)``).
    """
    sections = (sections,) if isinstance(sections, str) else tuple(sections)
    meta = {"sections": sections, "check": check, "kwarg": kwarg}
    if getattr(type(default), "__hash__", None) is None:
        factory = functools.partial(copy.deepcopy, default)
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_f = config_field
_pos_int, _nonneg_int = c.integer(1), c.integer(0)
_pos_int_or_none = c.integer(1, allow_none=True)
_nonneg_num, _pos_num = c.number(0.0), c.number(0.0, strict=True)
_nonneg_num_or_none = c.number(0.0, allow_none=True)
_pos_num_or_none = c.number(0.0, strict=True, allow_none=True)
_B, _D, _CB = c.boolean, c.mapping, c.callback_functions
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


@dataclasses.dataclass(init=False, repr=False, eq=False)
class _ConfigFields:
    """Typed declarations of every config key (see the module docstring)."""

    _FIELDS: ClassVar[dict[str, dataclasses.Field]]
    _KWARGS: ClassVar[dict[str, dict[str, str]]]

    # --- environment() ---
    env: Any = _f(None, ENV, c.env)
    env_config: dict = _f({}, ENV, _D)
    observation_space: Any = _f(None, ENV, c.space)
    action_space: Any = _f(None, ENV, c.space)
    render_env: bool = _f(False, ENV, _B)
    clip_rewards: bool | float | None = _f(None, ENV)
    normalize_actions: bool = _f(True, ENV, _B)
    clip_actions: bool = _f(False, ENV, _B)
    disable_env_checking: bool = _f(False, ENV, _B)
    is_atari: bool | None = _f(None, ENV)
    action_mask_key: str = _f("action_mask", ENV, c.optional_string)
    # --- env_runners() ---
    env_runner_cls: type | None = _f(None, RUN, c.optional_class)
    num_env_runners: int = _f(0, RUN, _nonneg_int)
    create_local_env_runner: bool = _f(True, RUN, _B)
    create_env_on_local_worker: bool = _f(False, RUN, _B)
    num_envs_per_env_runner: int = _f(1, RUN, _pos_int)
    gym_env_vectorize_mode: str = _f("sync", RUN, c.vectorize_mode)
    num_cpus_per_env_runner: float = _f(1, RUN, _nonneg_num)
    num_gpus_per_env_runner: float = _f(0, RUN, _nonneg_num)
    custom_resources_per_env_runner: dict = _f({}, RUN, _D)
    validate_env_runners_after_construction: bool = _f(True, RUN, _B)
    sample_timeout_s: float | None = _f(60.0, RUN, _pos_num_or_none)
    max_requests_in_flight_per_env_runner: int = _f(1, RUN, _pos_int)
    env_to_module_connector: Callable | None = _f(None, RUN, c.optional_callable)
    module_to_env_connector: Callable | None = _f(None, RUN, c.optional_callable)
    add_default_connectors_to_env_to_module_pipeline: bool = _f(True, RUN, _B)
    add_default_connectors_to_module_to_env_pipeline: bool = _f(True, RUN, _B)
    episode_lookback_horizon: int = _f(1, RUN, _nonneg_int)
    merge_env_runner_states: bool | str = _f("training_only", RUN, c.merge_env_runner_states)
    broadcast_env_runner_states: bool = _f(True, RUN, _B)
    use_env_runner_state_server: bool = _f(False, RUN, _B)
    env_runner_state_server_max_concurrency: int = _f(16, RUN, _pos_int)
    compress_observations: bool | str = _f(False, RUN)
    rollout_fragment_length: int | str = _f(200, RUN, c.rollout_fragment_length)
    batch_mode: str = _f(
        "truncate_episodes", RUN, c.choice("truncate_episodes", "complete_episodes")
    )
    explore: bool = _f(True, (RUN, EXPL), _B)
    episodes_to_numpy: bool = _f(True, RUN, _B)
    use_worker_filter_stats: bool = _f(True, RUN, _B)
    update_worker_filter_stats: bool = _f(True, RUN, _B)
    exploration_config: dict = _f({}, (RUN, EXPL), _D)
    remote_worker_envs: bool = _f(False, RUN, _B)
    remote_env_batch_wait_ms: float = _f(0, RUN, _nonneg_num)
    preprocessor_pref: str | None = _f("deepmind", RUN, c.optional_string)
    observation_filter: Any = _f("NoFilter", RUN, c.observation_filter)
    sampler_perf_stats_ema_coef: float | None = _f(None, RUN, _nonneg_num_or_none)
    sync_filters_on_rollout_workers_timeout_s: float = _f(10.0, RUN, _nonneg_num)
    # --- fault_tolerance() ---
    restart_failed_env_runners: bool = _f(True, FT, _B)
    ignore_env_runner_failures: bool = _f(False, FT, _B)
    max_num_env_runner_restarts: int = _f(1000, FT, c.integer(-1))
    # DELIBERATE DIFFERENCE: RLlib waits 60 s before a failed runner exits to be
    # restarted (pain point: users wait a minute per fault); we default to 1 s.
    delay_between_env_runner_restarts_s: float = _f(1.0, FT, _nonneg_num)
    restart_failed_sub_environments: bool = _f(False, FT, _B)
    num_consecutive_env_runner_failures_tolerance: int = _f(100, FT, _nonneg_int)
    env_runner_health_probe_timeout_s: float = _f(30.0, FT, _nonneg_num)
    env_runner_restore_timeout_s: float = _f(1800.0, FT, _nonneg_num)
    # --- multi_agent() ---
    policies: dict[str, PolicySpec] = _f({DEFAULT_POLICY_ID: PolicySpec()}, MA, c.policies)
    policy_map_capacity: int = _f(100, MA, _pos_int)
    policy_mapping_fn: Callable = _f(default_policy_mapping_fn, MA, c.optional_callable)
    policies_to_train: Any = _f(None, MA, c.policies_to_train)
    policy_states_are_swappable: bool = _f(False, MA, _B)
    observation_fn: Callable | None = _f(None, MA, c.optional_callable)
    count_steps_by: str = _f("env_steps", MA, c.choice("env_steps", "agent_steps"))
    # --- offline_data() ---
    input_: Any = _f("sampler", OFF, c.input_)
    input_config: dict = _f({}, OFF, _D)
    actions_in_input_normalized: bool = _f(False, OFF, _B)
    postprocess_inputs: bool = _f(False, OFF, _B)
    shuffle_buffer_size: int = _f(0, OFF, _nonneg_int)
    output: Any = _f(None, OFF, c.output)
    output_config: dict = _f({}, OFF, _D)
    output_compress_columns: list[str] = _f(["obs", "new_obs"], OFF)
    output_max_file_size: int = _f(64 * 1024 * 1024, OFF, _pos_int)
    offline_sampling: bool = _f(False, OFF, _B)
    # --- rl_module() ---
    model_config: dict = _f(dict(c.MODEL_DEFAULTS), MOD, c.model_config)
    rl_module_spec: Any = _f(None, MOD)
    algorithm_config_overrides_per_module: dict = _f({}, (MOD, MA), _D)
    # --- training() (and learners()) ---
    gamma: float = _f(0.99, TRAIN, _nonneg_num)
    lr: float | list = _f(0.001, TRAIN, c.learning_rate)
    grad_clip: float | None = _f(None, TRAIN, _nonneg_num_or_none)
    grad_clip_by: str = _f("global_norm", TRAIN, c.choice("value", "norm", "global_norm"))
    train_batch_size: int = _f(4000, TRAIN, _pos_int)
    train_batch_size_per_learner: int | None = _f(None, TRAIN, _pos_int_or_none)
    num_epochs: int = _f(1, TRAIN, _pos_int)
    minibatch_size: int | None = _f(None, TRAIN, _pos_int_or_none)
    shuffle_batch_per_epoch: bool = _f(False, TRAIN, _B)
    optimizer: dict = _f({}, TRAIN, _D)
    learner_class: type | None = _f(None, (TRAIN, LRN), c.optional_class)
    learner_connector: Callable | None = _f(None, (TRAIN, LRN), c.optional_callable)
    add_default_connectors_to_learner_pipeline: bool = _f(True, (TRAIN, LRN), _B)
    learner_config_dict: dict = _f({}, (TRAIN, LRN), _D)
    num_aggregator_actors_per_learner: int = _f(0, (TRAIN, LRN), _nonneg_int)
    max_requests_in_flight_per_aggregator_actor: int = _f(3, (TRAIN, LRN), _pos_int)
    num_learners: int = _f(0, LRN, _nonneg_int)
    num_cpus_per_learner: float | str = _f("auto", LRN)
    num_gpus_per_learner: float = _f(0, LRN, _nonneg_num)
    custom_resources_per_learner: dict = _f({}, LRN, _D)
    local_gpu_idx: int = _f(0, LRN, _nonneg_int)
    max_requests_in_flight_per_learner: int = _f(3, LRN, _pos_int)
    # --- framework() ---
    framework_str: str = _f("torch", FW, c.framework, kwarg="framework")
    torch_compile_learner: bool = _f(False, FW, _B)
    torch_compile_learner_what_to_compile: str = _f("forward_train", FW)
    torch_compile_learner_dynamo_backend: str = _f("inductor", FW)
    torch_compile_learner_dynamo_mode: str | None = _f(None, FW)
    torch_compile_worker: bool = _f(False, FW, _B)
    torch_compile_worker_dynamo_backend: str = _f("onnxrt", FW)
    torch_compile_worker_dynamo_mode: str | None = _f(None, FW)
    torch_ddp_kwargs: dict = _f({}, FW, _D)
    torch_skip_nan_gradients: bool = _f(False, FW, _B)
    # --- api_stack() ---
    enable_rl_module_and_learner: bool = _f(True, "api_stack", _B)
    enable_env_runner_and_connector_v2: bool = _f(True, "api_stack", _B)
    # --- debugging() ---
    log_level: str = _f("WARN", DBG, c.log_level)
    log_sys_usage: bool = _f(True, DBG, _B)
    fake_sampler: bool = _f(False, DBG, _B)
    seed: int | None = _f(None, DBG, c.seed)
    # --- callbacks() ---
    callbacks_class: list[type] = _f([], CBS, c.callbacks_class)
    callbacks_on_algorithm_init: list | None = _f(None, CBS, _CB, kwarg="on_algorithm_init")
    callbacks_on_train_result: list | None = _f(None, CBS, _CB, kwarg="on_train_result")
    callbacks_on_evaluate_start: list | None = _f(None, CBS, _CB, kwarg="on_evaluate_start")
    callbacks_on_evaluate_end: list | None = _f(None, CBS, _CB, kwarg="on_evaluate_end")
    callbacks_on_env_runners_recreated: list | None = _f(
        None, CBS, _CB, kwarg="on_env_runners_recreated"
    )
    callbacks_on_checkpoint_loaded: list | None = _f(None, CBS, _CB, kwarg="on_checkpoint_loaded")
    callbacks_on_environment_created: list | None = _f(
        None, CBS, _CB, kwarg="on_environment_created"
    )
    callbacks_on_episode_created: list | None = _f(None, CBS, _CB, kwarg="on_episode_created")
    callbacks_on_episode_start: list | None = _f(None, CBS, _CB, kwarg="on_episode_start")
    callbacks_on_episode_step: list | None = _f(None, CBS, _CB, kwarg="on_episode_step")
    callbacks_on_episode_end: list | None = _f(None, CBS, _CB, kwarg="on_episode_end")
    callbacks_on_sample_end: list | None = _f(None, CBS, _CB, kwarg="on_sample_end")
    # --- reporting() ---
    keep_per_episode_custom_metrics: bool = _f(False, REP, _B)
    metrics_episode_collection_timeout_s: float = _f(60.0, REP, _nonneg_num)
    metrics_num_episodes_for_smoothing: int = _f(100, REP, _pos_int)
    min_time_s_per_iteration: float | None = _f(None, REP, _nonneg_num_or_none)
    min_train_timesteps_per_iteration: int = _f(0, REP, _nonneg_int)
    min_sample_timesteps_per_iteration: int = _f(0, REP, _nonneg_int)
    log_gradients: bool = _f(False, REP, _B)
    custom_stats_cls_lookup: dict = _f({}, REP, _D)
    # --- evaluation() ---
    evaluation_interval: int | None = _f(None, EVAL, c.integer(0, allow_none=True))
    evaluation_duration: int | str = _f(10, EVAL, c.int_or_auto(1))
    evaluation_duration_unit: str = _f("episodes", EVAL, c.choice("episodes", "timesteps"))
    evaluation_auto_duration_min_env_steps_per_sample: int = _f(100, EVAL, _pos_int)
    evaluation_auto_duration_max_env_steps_per_sample: int = _f(2000, EVAL, _pos_int)
    evaluation_sample_timeout_s: float = _f(120.0, EVAL, _pos_num)
    evaluation_parallel_to_training: bool = _f(False, EVAL, _B)
    evaluation_force_reset_envs_before_iteration: bool = _f(True, EVAL, _B)
    evaluation_config: Any = _f(None, EVAL, c.evaluation_config)
    off_policy_estimation_methods: dict = _f({}, EVAL, _D)
    ope_split_batch_by_episode: bool = _f(True, EVAL, _B)
    evaluation_num_env_runners: int = _f(0, EVAL, _nonneg_int)
    custom_evaluation_function: Callable | None = _f(None, EVAL, c.optional_callable)
    in_evaluation: bool = _f(False, (), _B)  # set on evaluation copies, not by a builder
    # --- resources() ---
    num_gpus: float = _f(0, RES, _nonneg_num)
    _fake_gpus: bool = _f(False, RES, _B)
    num_cpus_for_main_process: float = _f(1, RES, _nonneg_num)
    custom_resources_for_main_process: dict = _f({}, RES, _D)
    placement_strategy: str = _f(
        "PACK", RES, c.choice("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
    )
    # --- checkpointing(), python_environment() ---
    export_native_model_files: bool = _f(False, CKPT, _B)
    checkpoint_trainable_policies_only: bool = _f(False, CKPT, _B)
    extra_python_environs_for_driver: dict = _f({}, PYENV, _D)
    extra_python_environs_for_worker: dict = _f({}, PYENV, _D)
    # --- experimental() ---
    _validate_config: bool = _f(True, EXP, _B)
    _use_msgpack_checkpoints: bool = _f(False, EXP, _B)
    _torch_grad_scaler_class: type | None = _f(None, EXP, c.optional_class)
    _torch_lr_scheduler_classes: Any = _f(None, EXP)
    _disable_preprocessor_api: bool = _f(False, EXP, _B)
    _disable_action_flattening: bool = _f(False, EXP, _B)
    _disable_initialize_loss_from_dummy_batch: bool = _f(False, EXP, _B)
    _dont_auto_sync_env_runner_states: bool = _f(False, (), _B)


def finalize_fields(cls: type) -> None:
    """Make ``cls`` a dataclass of its annotated keys and build its lookup tables.

    Why: called for the base and, via ``__init_subclass__``, for every subclass,
    so algorithm configs add keys by plain annotated class attributes.
    Redeclared inherited keys keep their builder section and check.
    """
    inherited = dict(getattr(cls, "_FIELDS", {}))
    if cls is not _ConfigFields:
        dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    for f in dataclasses.fields(cls):
        if not f.metadata:
            base = inherited.get(f.name)
            meta = dict(base.metadata) if base else {"sections": (TRAIN,), "check": c.any_value}
            meta.setdefault("kwarg", None)
            f.metadata = types.MappingProxyType(meta)
    cls._FIELDS = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, dict[str, str]] = {}
    for f in cls._FIELDS.values():
        for section in f.metadata["sections"]:
            kwargs.setdefault(section, {})[f.metadata["kwarg"] or f.name] = f.name
    cls._KWARGS = kwargs


finalize_fields(_ConfigFields)


def default_value(cls: type, field: dataclasses.Field) -> Any:
    """Return a fresh default of ``field`` for a new instance of ``cls``.

    A plain class attribute of the same name in a subclass (``lr = 5e-5``,
    without annotation) overrides the declared default.
    """
    value = getattr(cls, field.name, dataclasses.MISSING)
    if value is dataclasses.MISSING:
        return field.default_factory()
    return copy.deepcopy(value)


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
        ["offline_data_class", "input_read_method", "input_read_method_kwargs",
         "input_read_schema", "input_read_episodes", "input_read_sample_batches",
         "input_read_batch_size", "input_filesystem", "input_filesystem_kwargs",
         "input_compress_columns", "materialize_data", "materialize_mapped_data",
         "map_batches_kwargs", "iter_batches_kwargs", "ignore_final_observation",
         "prelearner_class", "prelearner_buffer_class", "prelearner_buffer_kwargs",
         "prelearner_module_synch_period", "prelearner_use_recorded_module_states",
         "dataset_num_iters_per_learner", "output_max_rows_per_file",
         "output_write_remaining_data", "output_write_method", "output_write_method_kwargs",
         "output_filesystem", "output_filesystem_kwargs", "output_write_episodes",
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
        "new-stack offline RL and offline evaluation (ray.data pipelines) are out of scope",
    ),
    **dict.fromkeys(
        ["sample_collector", "synchronize_filter", "enable_connectors", "replay_mode",
         "policy_map_cache", "_enable_rl_module_api", "env_task_fn",
         "evaluation_unhealthy_workers_timeout_s", "evaluation_error_after_n_consecutive_skips",
         "always_attach_evaluation_results"],
        "it is deprecated in RLlib and has no effect here",
    ),
}  # fmt: skip
# dict-style key (RLlib's to_dict / old dict configs) <-> attribute name.
DICT_KEYS = {
    "framework_str": "framework",
    "input_": "input",
    "callbacks_class": "callbacks",
    "lambda_": "lambda",
}
