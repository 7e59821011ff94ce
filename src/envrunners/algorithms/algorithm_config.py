"""``AlgorithmConfig``: RLlib's config object with its builder methods, for the sampling layer.

Why: runners, groups and offline readers all read one config object. Keys are
declared once, as data, in the field table of
:mod:`envrunners.algorithms._config_fields`; their value checks are the functions of
:mod:`envrunners.algorithms._config_checks`. The class here turns the table into
behaviour: RLlib's builder methods (``environment()``, ``env_runners()``, ...),
checked sets (builder keyword, attribute, dict key), freezing, dict I/O, the
derived values (``get_rollout_fragment_length``, ``is_multi_agent``) and
``validate()``, which reports every problem at once. ``NotProvided`` (the default
of every builder keyword) is defined here, at its RLlib path.

Deliberate differences from RLlib: ``delay_between_env_runner_restarts_s``
defaults to 1 s (not 60 s); the train-batch vs fragment-length mismatch of
``validate()`` is a warning that says the fix, not an error; TensorFlow is not
supported (``framework('tf2')`` raises ``ConfigError``).
"""

from __future__ import annotations

import copy
import inspect
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

from envrunners.algorithms import _config_checks as c
from envrunners.algorithms._config_fields import (
    CBS,
    CKPT,
    DBG,
    DICT_KEYS,
    ENV,
    EVAL,
    EXP,
    EXPL,
    FIELDS,
    FT,
    FW,
    LRN,
    MA,
    MOD,
    MOVED,
    OFF,
    PYENV,
    RENAMED,
    REP,
    RES,
    RUN,
    TF_ONLY,
    TRAIN,
    UNSUPPORTED,
    UNSUPPORTED_VALUES,
    ConfigField,
    builder_keywords,
    default_policy_mapping_fn,
    extend_fields,
)
from envrunners.core import DEFAULT_POLICY_ID
from envrunners.env.registry import env_registrations
from envrunners.errors import (
    ConfigError,
    FrozenConfigError,
    NoAlgorithmClassError,
    UnknownOptionError,
    suggest,
)

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["AlgorithmConfig", "FrozenConfigError", "NotProvided"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_ATTR_FOR_DICT_KEY = {key: attr for attr, key in DICT_KEYS.items()}
_INTERNAL_ATTRS = frozenset({"_is_frozen", "algo_class"})
#: Key of the pickled state that carries env registrations (see ``__getstate__``).
_ENV_REGISTRATIONS = "_env_registrations"


class _NotProvidedMeta(type):
    def __repr__(cls) -> str:
        return "NotProvided"


class NotProvided(metaclass=_NotProvidedMeta):
    """Default of every builder keyword: "leave this key unchanged" (as in RLlib)."""


def _warn(message: str, category: type[Warning] = DeprecationWarning) -> None:
    """Warn with the stack level of the first caller outside ``envrunners.algorithms``."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_HERE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _equal(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # e.g. numpy arrays inside env_config
        return False


# builder method -> (section, positional parameters); used to publish signatures.
_BUILDERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "environment": (ENV, ("env",)), "env_runners": (RUN, ()), "fault_tolerance": (FT, ()),
    "multi_agent": (MA, ()), "offline_data": (OFF, ()), "rl_module": (MOD, ()),
    "training": (TRAIN, ()), "learners": (LRN, ()), "framework": (FW, ("framework",)),
    "debugging": (DBG, ()), "callbacks": (CBS, ("callbacks_class",)), "reporting": (REP, ()),
    "evaluation": (EVAL, ()), "resources": (RES, ()), "experimental": (EXP, ()),
    "python_environment": (PYENV, ()),
}  # fmt: skip


class AlgorithmConfig:
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
    #: ``{attribute name: ConfigField}``: the field table (a subclass's extends its base's).
    _FIELDS: ClassVar[dict[str, ConfigField]] = {f.name: f for f in FIELDS}
    #: ``{builder section: {keyword: attribute name}}``, derived from ``_FIELDS``.
    _KWARGS: ClassVar[dict[str, dict[str, str]]] = builder_keywords(_FIELDS)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Extend the field table by the subclass's declarations; publish its builder keywords.

        Why: algorithm configs add keys by plain annotated class attributes (see
        ``_config_fields.extend_fields``); the table then holds them, so they are
        removed from the class body.
        """
        super().__init_subclass__(**kwargs)
        fields = extend_fields(cls._FIELDS, inspect.get_annotations(cls), dict(vars(cls)))
        for name in fields.keys() & vars(cls).keys():
            delattr(cls, name)
        cls._FIELDS = fields
        cls._KWARGS = builder_keywords(fields)
        cls._publish_signatures()

    def __init__(self, algo_class: type | None = None) -> None:
        object.__setattr__(self, "_is_frozen", False)
        object.__setattr__(self, "algo_class", algo_class)
        for name, field in type(self)._FIELDS.items():
            object.__setattr__(self, name, field.new_default())

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
                ``gym_env_vectorize_mode`` (``"sync"``/``"async"``/``"vector_entry_point"``/
                ``"envpool"``/``"shared_memory"``),
                ``sample_timeout_s``, ``observation_filter``, ``remote_worker_envs``,
                ``create_env_on_local_worker``, ``num_cpus_per_env_runner``,
                ``max_requests_in_flight_per_env_runner``, ``episode_lookback_horizon``,
                ``ready_first_batch_size`` (envrunners' own: int or None; with an
                asynchronous backend, act on the first this many ready sub-envs),
                ``overlap_inference`` (envrunners' own: True, False or ``"auto"``; infer
                for one half of the sub-envs while the other half steps; ``"auto"``
                measures both costs at runner start),
                ``pause_gc_during_sample`` (envrunners' own, default True: while a
                new-stack runner samples, Python's automatic garbage collection waits
                for 100,000 new objects instead of 700; False keeps the interpreter's
                thresholds),
                ``env_to_module_connector`` (``fn(env, spaces, device)``, or the old
                ``fn(env)``, returning a ConnectorV2, a list of them or a pipeline),
                ``module_to_env_connector`` (``fn(env, spaces)`` or ``fn(env)``),
                ``add_default_connectors_to_env_to_module_pipeline`` /
                ``add_default_connectors_to_module_to_env_pipeline`` (bool; the latter
                adds ``NormalizeAndClipActions`` for Box actions), envrunners' own
                ``sample_continuously`` (default False; True: the remote runners keep
                sampling while the driver trains, each with at most
                ``max_requests_in_flight_per_env_runner`` requests outstanding, and
                trained data is at most that many weight versions old; needs
                ``num_env_runners >= 1`` and the new API stack) and the other keys in
                this method's signature. Old names such as ``num_rollout_workers``
                still work with a ``DeprecationWarning``.
        """
        return self._update(RUN, kwargs)

    def rollouts(self, **kwargs: Any) -> Self:
        """Deprecated name of :meth:`env_runners` (warns, then forwards)."""
        _warn("config.rollouts() is deprecated; use config.env_runners() instead.")
        return self._update(RUN, kwargs)

    def fault_tolerance(self, **kwargs: Any) -> Self:
        """Set how failed runners and sub-envs are restarted, ignored or reported.

        Args:
            **kwargs: ``restart_failed_env_runners``, ``ignore_env_runner_failures``,
                ``max_num_env_runner_restarts``, ``delay_between_env_runner_restarts_s``
                (default 1 s here, 60 s in RLlib), ``restart_failed_sub_environments``,
                ``num_consecutive_env_runner_failures_tolerance``,
                ``env_runner_health_probe_timeout_s``, ``env_runner_restore_timeout_s``,
                and envrunners' own ``replace_env_runner_after_missed_deadlines``
                (default 2: a runner whose ``sample()`` is still running that many
                ``sample_timeout_s`` deadlines after it was sent is killed and replaced;
                it is out of service from its first missed deadline); old names (``recreate_failed_workers``, ``ignore_worker_failures``,
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
        """Set where runners read experience from and write it to.

        Args:
            **kwargs: ``input_`` (``"sampler"``, paths, a dict of input -> probability,
                or a callable), ``input_config``, ``actions_in_input_normalized``,
                ``postprocess_inputs``, ``shuffle_buffer_size``, ``output``,
                ``output_config``, ``output_compress_columns``, ``output_max_file_size``,
                ``offline_sampling``; new stack (``OfflineData``,
                ``OfflineSingleAgentEnvRunner``, Parquet): ``input_read_method``,
                ``input_read_method_kwargs``, ``input_read_episodes``,
                ``input_read_batch_size``, ``input_compress_columns``,
                ``map_batches_kwargs``, ``iter_batches_kwargs``,
                ``dataset_num_iters_per_learner``, ``output_write_episodes``,
                ``output_max_rows_per_file``, ``output_write_remaining_data``,
                ``output_write_method``, ``output_write_method_kwargs``.
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
        ignored with a warning; ``torch_compile_*`` and ``torch_ddp_kwargs`` are stored,
        and ``validate()`` refuses values other than their defaults (no code uses them).
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
        _warn("config.exploration() is deprecated; use config.env_runners(explore=...) instead.")
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

    # ------------------------------------------------------------------ validation
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
                value = cls._FIELDS[name].check(name, getattr(self, name))
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
            _warn(message, UserWarning)
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
            _warn(message, UserWarning)

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
        fields = type(self)._FIELDS
        for key, reason in UNSUPPORTED_VALUES.items():
            value = getattr(self, key)
            if value != fields[key].default:
                problems.append(
                    f"{key}={value!r} is not supported by envrunners ({reason}); "
                    f"leave it at its default {fields[key].default!r}."
                )
        if self.grad_clip is not None and self.grad_clip_by != "global_norm":
            problems.append(
                f"grad_clip_by={self.grad_clip_by!r} is not supported by envrunners: gradients "
                "are clipped by their global norm; use grad_clip_by='global_norm'."
            )
        if self.enable_rl_module_and_learner and self.exploration_config:
            # RLlib's own text (AlgorithmConfig.validate, new API stack).
            problems.append(
                "When the RLModule API is enabled, exploration_config can not be set. If you "
                "want to implement custom exploration behaviour, please modify the "
                "`forward_exploration` method of the RLModule at hand. On configs that have a "
                "default exploration config, this must be done via "
                f"`config.exploration_config={{}}` (got {self.exploration_config!r})."
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

    # ------------------------------------------------------------------ attributes
    def __setattr__(self, name: str, value: Any) -> None:
        """Set a key after its check; unknown names raise ``ConfigError`` with a close match."""
        if name == "_is_frozen":
            object.__setattr__(self, name, value)
            return
        self._check_not_frozen(name)
        cls = type(self)
        if name in cls._FIELDS:
            object.__setattr__(self, name, cls._FIELDS[name].check(name, value))
        elif name in RENAMED:
            _warn(f"config.{name} is deprecated; use config.{RENAMED[name][0]} instead.")
            setattr(self, RENAMED[name][0], value)
        elif name == "model":
            object.__setattr__(self, "model_config", c.model_config(name, value))
        elif name in _INTERNAL_ATTRS or isinstance(getattr(cls, name, None), property):
            object.__setattr__(self, name, value)
        else:
            hint = suggest(name, cls._FIELDS, n=1) or (
                " New keys of a config subclass are declared as annotated class attributes."
            )
            raise ConfigError(f"Unknown option {name!r} for {cls.__name__}.{hint}")

    def __getattr__(self, name: str) -> Any:
        """Resolve deprecated key names (with a ``DeprecationWarning``); else ``AttributeError``."""
        if not name.startswith("__") and name in RENAMED:
            _warn(f"config.{name} is deprecated; use config.{RENAMED[name][0]} instead.")
            return getattr(self, RENAMED[name][0])
        hint = suggest(name, type(self)._FIELDS, n=1) if not name.startswith("__") else ""
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}.{hint}")

    def __eq__(self, other: object) -> bool:
        """Configs are equal when they have the same type and equal keys."""
        if type(other) is not type(self):
            return NotImplemented
        return all(_equal(getattr(self, n), getattr(other, n)) for n in type(self)._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        """Show only the keys that differ from the defaults."""
        cls = type(self)
        changed = [
            f"{name}={getattr(self, name)!r}"
            for name, field in cls._FIELDS.items()
            if not _equal(getattr(self, name), field.default)
        ]
        return f"{cls.__name__}({', '.join(changed)})"

    # ------------------------------------------------------------------ lifecycle
    def build_algo(self, env: Any = None, **kwargs: Any) -> Any:
        """Build the algorithm of this config: ``self.algo_class(config=self)``.

        Args:
            env: Optional env (id or creator) replacing ``self.env``.
            **kwargs: Other RLlib keywords (``logger_creator``, ...), passed on.

        Raises:
            NoAlgorithmClassError: The config names no algorithm class (a base
                ``AlgorithmConfig()``; use ``PPOConfig``/``PGConfig``). A ``ConfigError``
                and, as RLlib raises there, a ``TypeError``.
        """
        if self.algo_class is None:
            raise NoAlgorithmClassError(
                f"{type(self).__name__} names no algorithm class: build_algo() needs an "
                "algorithm's config (PPOConfig(), PGConfig()) or AlgorithmConfig(algo_class=...)"
            )
        return self.algo_class(config=self, env=env, **kwargs)

    def build(self, env: Any = None, **kwargs: Any) -> Any:
        """Deprecated name of :meth:`build_algo` (warns, as RLlib does)."""
        _warn("config.build() is deprecated; use config.build_algo() instead.")
        return self.build_algo(env=env, **kwargs)

    def freeze(self) -> None:
        """Make this config read-only: any later set raises ``FrozenConfigError``.

        Why: runners and groups share the caller's config; freezing catches code
        that would change it for everyone. Get a modifiable copy with
        ``config.copy(copy_frozen=False)``.
        """
        self._is_frozen = True
        if isinstance(self.evaluation_config, AlgorithmConfig):
            self.evaluation_config.freeze()

    def __getstate__(self) -> dict[str, Any]:
        """The attributes, plus the creators of the envs registered under the names it uses.

        Why: runners in other processes (Ray actors, Tune trials) receive this config
        and build ``config.env`` by name; a name given to ``register_env`` in this
        process would be unknown there. Unpickling registers it (see
        ``registry._EnvRegistration``), as RLlib's cluster-wide registry would.
        """
        state = self.__dict__.copy()
        evaluation = self.evaluation_config
        registrations = env_registrations(
            self.env, evaluation.get("env") if isinstance(evaluation, dict) else None
        )
        if registrations:
            state[_ENV_REGISTRATIONS] = registrations
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state.pop(_ENV_REGISTRATIONS, None)  # (registered while unpickled)
        self.__dict__.update(state)

    def copy(self, copy_frozen: bool | None = None) -> Self:
        """Return a deep copy; ``copy_frozen`` None keeps the frozen state, False/True sets it."""
        config = copy.deepcopy(self)
        if copy_frozen is not None:
            config._is_frozen = bool(copy_frozen)
        return config

    # ------------------------------------------------------------------ dict I/O
    def to_dict(self) -> dict[str, Any]:
        """Return every key as a plain dict (deep-copied), with RLlib's dict names.

        ``framework_str``/``input_``/``callbacks_class``/``lambda_`` appear as
        ``framework``/``input``/``callbacks``/``lambda``; ``model`` repeats
        ``model_config`` for old-stack code. ``from_dict`` reads it back.
        """
        result = {DICT_KEYS.get(name, name): getattr(self, name) for name in type(self)._FIELDS}
        result["model"] = self.model_config
        return copy.deepcopy(result)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> Self:
        """Build a config from a dict (``to_dict`` output or an RLlib-style dict)."""
        return cls().update_from_dict(config_dict, _where=f"{cls.__name__}.from_dict()")

    def update_from_dict(self, config_dict: dict[str, Any], *, _where: str | None = None) -> Self:
        """Set keys from a dict; all or nothing, with every bad key reported at once.

        Accepts attribute names, RLlib's dict names (``framework``, ``input``,
        ``lambda``, ``callbacks``, ``model``), deprecated names (with a warning),
        and a legacy nested ``"multiagent"`` dict.
        """
        where = _where or f"{type(self).__name__}.update_from_dict()"
        self._check_not_frozen(next(iter(config_dict), "?"))
        flat = {k: v for k, v in config_dict.items() if k != "multiagent"}
        values, problems = self._resolve(None, flat, where)
        nested = config_dict.get("multiagent")
        if nested:
            more, found = self._resolve(MA, nested, f"{where}['multiagent']")
            values.update(more)
            problems.extend(found)
        if problems:
            raise ConfigError(problems=problems)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        return self

    @classmethod
    def overrides(cls, **kwargs: Any) -> dict[str, Any]:
        """Return ``kwargs`` as a dict of checked config overrides (e.g. for a ``PolicySpec``)."""
        _, problems = cls()._resolve(None, kwargs, f"{cls.__name__}.overrides()")
        if problems:
            raise ConfigError(problems=problems)
        return dict(kwargs)

    def _key_to_attr(self, key: str) -> str | None:
        name = _ATTR_FOR_DICT_KEY.get(key, key)
        if name in type(self)._FIELDS:
            return name
        return "model_config" if key == "model" else RENAMED.get(key, (None,))[0]

    def __getitem__(self, key: str) -> Any:
        """Dict-style read (``config["train_batch_size"]``, ``config["lambda"]``)."""
        name = self._key_to_attr(key)
        if name is None:
            raise KeyError(f"{key!r}.{suggest(key, self.keys(), n=1)}")
        return getattr(self, name)

    def __setitem__(self, key: str, value: Any) -> None:
        """Dict-style write; same checks as attribute assignment."""
        self.update_from_dict({key: value})

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._key_to_attr(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style read with a default for unknown keys."""
        return self[key] if key in self else default

    def keys(self) -> list[str]:
        """The keys of ``to_dict()``."""
        return [DICT_KEYS.get(n, n) for n in type(self)._FIELDS] + ["model"]

    def values(self) -> list[Any]:
        """The values of ``keys()`` (not copied)."""
        return [self[k] for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs of ``keys()`` (not copied)."""
        return [(k, self[k]) for k in self.keys()]

    def __iter__(self):
        return iter(self.keys())

    # ------------------------------------------------------------------ internals
    def _check_not_frozen(self, key: str) -> None:
        if self._is_frozen:
            raise FrozenConfigError(
                f"Cannot set {key!r}: the config is frozen; use config.copy(copy_frozen=False) "
                "to get a modifiable copy."
            )

    def _update(self, section: str, kwargs: dict[str, Any]) -> Self:
        """Check and set the builder ``section``'s kwargs: all or nothing."""
        given = {k: v for k, v in kwargs.items() if v is not NotProvided}
        if given:
            self._check_not_frozen(next(iter(given)))
        unknown: list[str] = []
        values, problems = self._resolve(
            section, given, f"{type(self).__name__}.{section}()", unknown
        )
        if problems:
            raise (UnknownOptionError if unknown else ConfigError)(problems=problems)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        return self

    def _resolve(
        self,
        section: str | None,
        kwargs: dict[str, Any],
        where: str,
        unknown: list[str] | None = None,
    ) -> tuple[dict[str, Any], list[str]]:
        """Map keys to attribute names and check values; return ``(values, problems)``.

        ``section=None`` accepts every key (dict I/O), a builder name only its keys;
        keys the builder does not take are appended to ``unknown`` when given.
        """
        cls, values, problems = type(self), {}, []
        for key, value in kwargs.items():
            try:
                if key == "model" and section in (None, TRAIN):
                    base = values.get("model_config", self.model_config)
                    values["model_config"] = {**base, **c.mapping("model", value)}
                    continue
                name = self._attr_for_key(section, key, where)
                if name is not None:
                    values[name] = cls._FIELDS[name].check(name, value)
            except ConfigError as e:
                problems.extend(e.problems)
                if unknown is not None and isinstance(e, UnknownOptionError):
                    unknown.append(key)
        return values, problems

    def _attr_for_key(self, section: str | None, key: str, where: str) -> str | None:
        cls = type(self)
        if section is None:
            accepted = {DICT_KEYS.get(n, n): n for n in cls._FIELDS}
            accepted.update({n: n for n in cls._FIELDS})
        else:
            accepted = cls._KWARGS.get(section, {})
        if key in accepted:
            return accepted[key]
        if key in RENAMED and (section is None or section in RENAMED[key][1]):
            _warn(f"{where}: option {key!r} is deprecated; use {RENAMED[key][0]!r} instead.")
            return RENAMED[key][0]
        if section in MOVED.get(key, ()):
            home = cls._home_section(key)
            _warn(f"{where}: option {key!r} moved; use {cls.__name__}.{home}({key}=...).")
            return key
        if key in TF_ONLY:
            _warn(f"{where}: {key!r} only configures TensorFlow, which envrunners does "
                  "not support; it is ignored.", UserWarning)  # fmt: skip
            return None
        if key in UNSUPPORTED:
            raise ConfigError(
                f"Option {key!r} of {where} is not supported by envrunners: {UNSUPPORTED[key]}."
            )
        # A keyword a builder method does not take is a TypeError, as Python raises for it.
        error = ConfigError if section is None else UnknownOptionError
        home = cls._home_section(key)
        if home is None and key in cls._FIELDS:
            raise error(
                f"Option {key!r} is not set by a builder method; assign config.{key} instead."
            )
        if home is not None:
            raise error(
                f"Option {key!r} is not accepted by {where}; set it with "
                f"{cls.__name__}.{home}({key}=...)."
            )
        raise error(f"Unknown option {key!r} for {where}.{suggest(key, accepted, n=1)}")

    @classmethod
    def _home_section(cls, key: str) -> str | None:
        """Return the builder that accepts ``key`` (or the key it was renamed to)."""
        key = RENAMED.get(key, (key,))[0]
        return next((s for s, kws in cls._KWARGS.items() if key in kws), None)

    @classmethod
    def _publish_signatures(cls) -> None:
        """Give the builders defined on ``cls`` a signature listing their keywords.

        Why: the keys live in one table, so ``help()``/``inspect.signature`` show
        the real keywords (those of ``cls``, e.g. PPO's ``training()`` keys) instead
        of ``**kwargs``.
        """
        kind = inspect.Parameter
        for method, (section, positional) in _BUILDERS.items():
            fn = cls.__dict__.get(method)
            if fn is None:
                continue
            params = [kind("self", kind.POSITIONAL_OR_KEYWORD)]
            params += [kind(p, kind.POSITIONAL_OR_KEYWORD, default=NotProvided) for p in positional]
            names = [k for k in cls._KWARGS.get(section, {}) if k not in positional]
            names += ["model"] if section == TRAIN else []
            params += [kind(k, kind.KEYWORD_ONLY, default=NotProvided) for k in names]
            fn.__signature__ = inspect.Signature(params, return_annotation=cls.__name__)


AlgorithmConfig._publish_signatures()
