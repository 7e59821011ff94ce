"""``AlgorithmConfig``: RLlib's config object with its builder methods, for the sampling layer.

Why: runners, groups and offline readers all read one config object. Keys are
declared once, typed, in :mod:`envrunners.algorithms._config_fields`; set-time
checks, freezing and dict I/O live in :mod:`envrunners.algorithms._config_base`.
This module holds RLlib's builder methods (``environment()``, ``env_runners()``,
...), the derived values (``get_rollout_fragment_length``, ``is_multi_agent``)
and ``validate()``, which reports every problem at once.

Deliberate differences from RLlib: ``delay_between_env_runner_restarts_s``
defaults to 1 s (not 60 s); the train-batch vs fragment-length mismatch of
``validate()`` is a warning that says the fix, not an error; TensorFlow is not
supported (``framework('tf2')`` raises ``ConfigError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envrunners.algorithms._config_base import (
    ConfigBase,
    FrozenConfigError,
    NotProvided,
    check_value,
    warn,
)
from envrunners.algorithms._config_fields import (
    CBS,
    CKPT,
    DBG,
    ENV,
    EVAL,
    EXP,
    EXPL,
    FT,
    FW,
    LRN,
    MA,
    MOD,
    OFF,
    PYENV,
    REP,
    RES,
    RUN,
    TRAIN,
    default_policy_mapping_fn,
)
from envrunners.core import DEFAULT_POLICY_ID
from envrunners.errors import ConfigError, suggest

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["AlgorithmConfig", "FrozenConfigError", "NotProvided"]


class AlgorithmConfig(ConfigBase):
    """RLlib's ``AlgorithmConfig`` for experience collection: typed keys, builder methods.

    Why: every runner, group and reader reads this one object, so it checks
    values where they are set (a wrong key or value fails at the builder call,
    naming the fix), and ``validate()`` reports all remaining problems at once.
    Each builder returns ``self`` for chaining and accepts exactly RLlib's keywords
    (see ``inspect.signature(AlgorithmConfig.env_runners)``); unknown keywords
    raise ``ConfigError`` with a close match.

    Args:
        algo_class: Optional algorithm class, stored as ``algo_class``; nothing
            here needs one.

    Example:
        >>> config = (
        ...     AlgorithmConfig()
        ...     .environment("CartPole-v1")
        ...     .env_runners(num_env_runners=2, num_envs_per_env_runner=4)
        ... )
        >>> config.get_rollout_fragment_length(worker_index=1)
        200
    """

    DEFAULT_POLICY_MAPPING_FN = staticmethod(default_policy_mapping_fn)

    # ------------------------------------------------------------------ builders
    def environment(self, env: Any = NotProvided, **kwargs: Any) -> Self:
        """Set the env and how runners build and wrap it.

        Args:
            env: A gymnasium id or registered name (str), a ``gymnasium.Env``
                subclass, or a creator ``(EnvContext) -> env``.
            **kwargs: ``env_config`` (dict given to creators as ``EnvContext``),
                ``observation_space``, ``action_space``, ``render_env``,
                ``clip_rewards``, ``normalize_actions``, ``clip_actions``,
                ``disable_env_checking``, ``is_atari``, ``action_mask_key``.
        """
        return self._update(ENV, {"env": env, **kwargs})

    def env_runners(self, **kwargs: Any) -> Self:
        """Set how many runners sample, with how many envs, and how they sample.

        Args:
            **kwargs: ``num_env_runners``, ``num_envs_per_env_runner`` (int > 0),
                ``rollout_fragment_length`` (int > 0 or ``"auto"``), ``batch_mode``
                (``"truncate_episodes"``/``"complete_episodes"``), ``explore``,
                ``gym_env_vectorize_mode`` (``"sync"``/``"async"``/``"vector_entry_point"``),
                ``sample_timeout_s``, ``observation_filter``, ``remote_worker_envs``,
                ``create_env_on_local_worker``, ``num_cpus_per_env_runner``,
                ``max_requests_in_flight_per_env_runner``, ``episode_lookback_horizon``,
                ``env_to_module_connector``, ``module_to_env_connector`` and the
                other keys in this method's signature. Old names such as
                ``num_rollout_workers`` still work with a ``DeprecationWarning``.
        """
        return self._update(RUN, kwargs)

    def rollouts(self, **kwargs: Any) -> Self:
        """Deprecated name of :meth:`env_runners` (warns, then forwards)."""
        warn("config.rollouts() is deprecated; use config.env_runners() instead.")
        return self._update(RUN, kwargs)

    def fault_tolerance(self, **kwargs: Any) -> Self:
        """Set how failed runners and sub-envs are restarted, ignored or reported.

        Args:
            **kwargs: ``restart_failed_env_runners``, ``ignore_env_runner_failures``,
                ``max_num_env_runner_restarts``, ``delay_between_env_runner_restarts_s``
                (default 1 s here, 60 s in RLlib), ``restart_failed_sub_environments``,
                ``num_consecutive_env_runner_failures_tolerance``,
                ``env_runner_health_probe_timeout_s``, ``env_runner_restore_timeout_s``;
                old names (``recreate_failed_workers``, ``ignore_worker_failures``,
                ``recreate_failed_env_runners``, ...) warn and map to these.
        """
        return self._update(FT, kwargs)

    def multi_agent(self, **kwargs: Any) -> Self:
        """Set the policies (modules) and how agents map to them.

        Args:
            **kwargs: ``policies`` (dict id -> ``PolicySpec`` | 4-tuple | None, or
                a list/set of ids), ``policy_mapping_fn``, ``policies_to_train``
                (ids or a callable), ``count_steps_by`` (``"env_steps"``/``"agent_steps"``),
                ``policy_map_capacity``, ``policy_states_are_swappable``, ``observation_fn``.
        """
        return self._update(MA, kwargs)

    def offline_data(self, **kwargs: Any) -> Self:
        """Set where old-stack runners read experience from and write it to.

        Args:
            **kwargs: ``input_`` (``"sampler"``, paths, a dict of input -> probability,
                or a callable), ``input_config``, ``actions_in_input_normalized``,
                ``postprocess_inputs``, ``shuffle_buffer_size``, ``output``,
                ``output_config``, ``output_compress_columns``, ``output_max_file_size``,
                ``offline_sampling``.
        """
        return self._update(OFF, kwargs)

    def rl_module(self, **kwargs: Any) -> Self:
        """Set the model of the runners' modules.

        Args:
            **kwargs: ``model_config`` (dict; missing keys get the defaults, e.g.
                ``fcnet_hiddens=[256, 256]``), ``rl_module_spec``,
                ``algorithm_config_overrides_per_module``.
        """
        return self._update(MOD, kwargs)

    def training(self, **kwargs: Any) -> Self:
        """Set the training keys the runners and postprocessing read.

        Args:
            **kwargs: ``gamma``, ``lr``, ``train_batch_size``,
                ``train_batch_size_per_learner``, ``num_epochs``, ``minibatch_size``,
                ``grad_clip``, ``optimizer``, ``model`` (old-stack dict, merged into
                ``model_config``), plus each algorithm's own keys.
        """
        return self._update(TRAIN, kwargs)

    def learners(self, **kwargs: Any) -> Self:
        """Set the learner count and resources (stored; learners are outside this package)."""
        return self._update(LRN, kwargs)

    def framework(self, framework: str = NotProvided, **kwargs: Any) -> Self:
        """Select the deep-learning framework: only ``"torch"``; TensorFlow raises ``ConfigError``.

        TensorFlow-only options (``eager_tracing``, ``tf_session_args``, ...) are
        ignored with a warning; ``torch_compile_*`` and ``torch_ddp_kwargs`` are stored.
        """
        return self._update(FW, {"framework": framework, **kwargs})

    def api_stack(
        self,
        enable_rl_module_and_learner: bool | None = None,
        enable_env_runner_and_connector_v2: bool | None = None,
    ) -> Self:
        """Choose the new stack (episodes, default) or the old one (``RolloutWorker``).

        Args:
            enable_rl_module_and_learner: RLModule/Learner API (``None``: unchanged).
            enable_env_runner_and_connector_v2: ``False`` selects the old-stack
                ``RolloutWorker`` runners (``None``: unchanged).
        """
        values = {
            "enable_rl_module_and_learner": enable_rl_module_and_learner,
            "enable_env_runner_and_connector_v2": enable_env_runner_and_connector_v2,
        }
        return self._update("api_stack", {k: v for k, v in values.items() if v is not None})

    def debugging(self, **kwargs: Any) -> Self:
        """Set ``seed`` (runner seeds derive from it), ``log_level``, ``log_sys_usage``, ``fake_sampler``."""
        return self._update(DBG, kwargs)

    def callbacks(self, callbacks_class: Any = NotProvided, **kwargs: Any) -> Self:
        """Set callback classes and per-event callback functions.

        Args:
            callbacks_class: A callbacks class or a list of them (stored as a list;
                runners instantiate each).
            **kwargs: Per-event functions, each a callable or a list of callables:
                ``on_environment_created``, ``on_episode_created``, ``on_episode_start``,
                ``on_episode_step``, ``on_episode_end``, ``on_sample_end``, and the
                algorithm-level ``on_algorithm_init``, ``on_train_result``, ...
                Stored as ``config.callbacks_on_<event>``.
        """
        return self._update(CBS, {"callbacks_class": callbacks_class, **kwargs})

    def reporting(self, **kwargs: Any) -> Self:
        """Set metric windows and reporting (``metrics_num_episodes_for_smoothing``, ...)."""
        return self._update(REP, kwargs)

    def evaluation(self, **kwargs: Any) -> Self:
        """Set when and how evaluation runners sample.

        Why: evaluation runners are a second group built from
        ``get_evaluation_config_object()``, i.e. this config plus overrides.

        Args:
            **kwargs: ``evaluation_interval``, ``evaluation_num_env_runners``,
                ``evaluation_duration`` (int or ``"auto"``), ``evaluation_duration_unit``
                (``"episodes"``/``"timesteps"``), ``evaluation_sample_timeout_s``,
                ``evaluation_parallel_to_training``, ``evaluation_config`` (dict of
                overrides), ``custom_evaluation_function``; ``evaluation_num_workers``
                is the deprecated name of ``evaluation_num_env_runners``.
        """
        return self._update(EVAL, kwargs)

    def resources(self, **kwargs: Any) -> Self:
        """Set driver resources (``num_gpus``, ``num_cpus_for_main_process``, ...).

        Old names ``num_cpus_per_worker``/``num_gpus_per_worker``/``custom_resources_per_worker``
        warn and map to the ``*_per_env_runner`` keys of :meth:`env_runners`.
        """
        return self._update(RES, kwargs)

    def exploration(self, **kwargs: Any) -> Self:
        """Deprecated: set ``explore``/``exploration_config`` via :meth:`env_runners`."""
        warn("config.exploration() is deprecated; use config.env_runners(explore=...) instead.")
        return self._update(EXPL, kwargs)

    def checkpointing(
        self,
        export_native_model_files: bool = NotProvided,
        checkpoint_trainable_policies_only: bool = NotProvided,
    ) -> Self:
        """Set checkpoint options (old-stack ``RolloutWorker.get_state`` reads the second)."""
        values = {
            "export_native_model_files": export_native_model_files,
            "checkpoint_trainable_policies_only": checkpoint_trainable_policies_only,
        }
        return self._update(CKPT, values)

    def experimental(self, **kwargs: Any) -> Self:
        """Set experimental keys (``_disable_preprocessor_api``, ``_disable_action_flattening``)."""
        return self._update(EXP, kwargs)

    def python_environment(self, **kwargs: Any) -> Self:
        """Set env variables for the driver / remote runners (``extra_python_environs_for_*``)."""
        return self._update(PYENV, kwargs)

    # ------------------------------------------------------------------ derived values
    @property
    def is_multi_agent(self) -> bool:
        """True unless the only policy is ``"default_policy"``."""
        return len(self.policies) > 1 or DEFAULT_POLICY_ID not in self.policies

    @property
    def total_train_batch_size(self) -> int:
        """Steps per training batch (read by ``"auto"`` fragment lengths).

        ``train_batch_size_per_learner * max(num_learners, 1)`` if the per-learner
        size is set, else ``train_batch_size`` (one learner here).
        """
        if self.train_batch_size_per_learner is not None:
            return self.train_batch_size_per_learner * max(self.num_learners, 1)
        return self.train_batch_size

    @property
    def model(self) -> dict:
        """Old-stack name of ``model_config`` (same dict)."""
        return self.model_config

    @property
    def stats_cls_lookup(self) -> dict:
        """Custom metric-stats classes for ``MetricsLogger`` (``custom_stats_cls_lookup``)."""
        return dict(self.custom_stats_cls_lookup)

    @property
    def is_frozen(self) -> bool:
        """Whether ``freeze()`` was called (then every set raises ``FrozenConfigError``)."""
        return self._is_frozen

    def get_rollout_fragment_length(self, worker_index: int = 0) -> int:
        """Return the steps per sub-env that runner ``worker_index`` collects per ``sample()``.

        Why: with ``rollout_fragment_length="auto"`` the fragments of all runners
        and envs add up to exactly ``total_train_batch_size``: when the batch does
        not divide evenly, the first runners take one extra step each.
        """
        if self.rollout_fragment_length != "auto":
            return self.rollout_fragment_length
        num_envs = self.num_envs_per_env_runner
        per_step = num_envs * (self.num_env_runners or 1)
        quotient, remainder = divmod(self.total_train_batch_size, per_step)
        if remainder == 0 or (worker_index - 1) * num_envs >= remainder:
            return quotient or 1
        return quotient + 1

    def get_evaluation_config_object(self) -> AlgorithmConfig:
        """Return the (unfrozen) config of evaluation runners.

        A copy with ``evaluation_config`` applied (a dict of overrides, or used as
        is if it is a config object), ``num_env_runners=evaluation_num_env_runners``
        and ``in_evaluation=True`` (which changes seeds and state merging).
        """
        overrides = self.evaluation_config
        if isinstance(overrides, AlgorithmConfig):
            config = overrides.copy(copy_frozen=False)
        else:
            config = self.copy(copy_frozen=False)
            config.evaluation_config = None
            config.num_env_runners = self.evaluation_num_env_runners
            if overrides:
                config.update_from_dict(overrides)
        config.in_evaluation = True
        return config

    def validate(self) -> None:
        """Check every key and their combinations; raise one ``ConfigError`` listing all problems.

        Why: a config built in pieces (attributes, dicts, in-place edits of dicts)
        can hold values no setter saw. Values are normalised as the setters do
        (unless frozen). Satisfiable-but-wasteful combinations, such as a train
        batch that the sampling rounds overshoot, are ``UserWarning``s that name
        the fix, never errors.
        """
        problems: list[str] = []
        cls = type(self)
        for name in cls._FIELDS:
            try:
                value = check_value(cls, name, getattr(self, name))
            except ConfigError as e:
                problems.extend(e.problems)
                continue
            if not self._is_frozen:
                object.__setattr__(self, name, value)
        if problems:  # combinations of bad values would only repeat (or crash on) them
            try:
                problems.extend(self._cross_field_problems())
            except Exception:
                pass
            raise ConfigError(problems=problems)
        problems.extend(self._cross_field_problems())
        for message in self._cross_field_warnings():
            warn(message, UserWarning)
        if problems:
            raise ConfigError(problems=problems)

    def validate_train_batch_size_vs_rollout_fragment_length(self) -> None:
        """Warn (RLlib raised) when sampling rounds overshoot the train batch by > 10 %.

        One round collects ``max(num_env_runners, 1) * num_envs_per_env_runner *
        rollout_fragment_length`` steps; the warning shows the arithmetic and the
        fragment length (or ``"auto"``) that fits.
        """
        message = self._fragment_length_mismatch()
        if message:
            warn(message, UserWarning)

    def _cross_field_problems(self) -> list[str]:
        """Problems that involve several keys (subclasses extend the list)."""
        problems = []
        to_train = self.policies_to_train
        if isinstance(to_train, (list, tuple, set, frozenset)):
            for pid in to_train:
                if pid not in self.policies:
                    problems.append(
                        f"policies_to_train names {pid!r}, which is not in policies "
                        f"({sorted(self.policies)}).{suggest(pid, self.policies, n=1)}"
                    )
        if isinstance(self.evaluation_config, dict):
            where = f"{type(self).__name__}.evaluation_config"
            _, found = self._resolve(None, self.evaluation_config, where)
            problems.extend(f"evaluation_config: {p}" for p in found)
        return problems

    def _cross_field_warnings(self) -> list[str]:
        """Satisfiable but probably unintended combinations (subclasses extend the list)."""
        found = [self._fragment_length_mismatch()]
        mb, total = self.minibatch_size, self.total_train_batch_size
        if mb is not None and mb > total:
            found.append(
                f"minibatch_size ({mb}) is larger than the train batch ({total}); each "
                f"epoch uses one minibatch of {total} steps. Set minibatch_size <= {total}."
            )
        return [m for m in found if m]

    def _fragment_length_mismatch(self) -> str | None:
        frag = self.rollout_fragment_length
        if frag == "auto" or self.batch_mode != "truncate_episodes" or self.in_evaluation:
            return None
        total, runners = self.total_train_batch_size, max(self.num_env_runners, 1)
        per_round = runners * self.num_envs_per_env_runner * frag
        rounds = -(-total // per_round)
        collected = rounds * per_round
        if collected - total <= 0.1 * total:
            return None
        fit = -(-total // (runners * self.num_envs_per_env_runner))
        return (
            f"train batch of {total} steps does not fit the sampling rounds: {runners} env "
            f"runner(s) x {self.num_envs_per_env_runner} env(s) x rollout_fragment_length={frag}"
            f" = {per_round} steps per round, so {rounds} round(s) collect {collected} steps, "
            f"{(collected - total) / total:.0%} more than {total}. Set "
            f"rollout_fragment_length='auto' (or {fit}) to collect {total} steps."
        )
