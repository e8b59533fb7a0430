"""The typed experiment config: one pydantic model per YAML section.

Unknown keys are errors everywhere (``extra="forbid"``) so a typo never
silently falls back to a default. Settings that only one backend understands
live under ``models.<group>.options`` and are validated by that backend's own
options model, so a third-party backend adds settings without touching this
file. Loading, ``--set`` overrides and error formatting: ``unimas.config.loading``.
``docs/config.md`` is generated from these models (``python -m unimas.preflight.config_reference``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from unimas.config.strict import Strict, safe_name


class LoraConfig(Strict):
    """LoRA adapters on a model group (peft); each role with ``adapter:`` gets its own."""

    r: int = Field(8, ge=1, description="adapter rank")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (peft `lora_alpha`; scale = alpha / r)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                      description="names of the linear modules that get adapters")
    train_base: bool = Field(False, description="also train the base weights; false = base frozen, adapters only")


class OptimConfig(Strict):
    """AdamW and its learning-rate schedule (one schedule step per trainer step)."""

    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2)")
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm per optimiser step")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate decay over `trainer.steps` updates, after warm-up")
    warmup_steps: int = Field(0, ge=0, description="updates with a linearly rising learning rate")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="floor of the decayed rate, as a fraction of `lr`")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= beta < 1 for beta in value):
            raise ValueError(f"each AdamW beta must be in [0, 1), got {list(value)}")
        return value


class ResourcesConfig(Strict):
    """What a model group asks for: its Ray actor's reservation (``runtime.kind: ray``) and its device."""

    cpus: float = Field(1.0, ge=0, description="CPUs reserved for the group's actor")
    gpus: float = Field(0.0, ge=0, description="GPUs reserved (fractions share one); > 0 = torch backend on CUDA")
    memory_gb: Optional[float] = Field(None, gt=0, description="memory reserved, in GiB; null = no reservation")
    custom: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict, description="custom Ray resources "
                                                             "reserved, e.g. `{pool_a: 1}`: the actor runs only on a "
                                                             "node started with them (`ray start --resources`)")

    @field_validator("custom")
    @classmethod
    def _custom_names(cls, custom: dict[str, float]) -> dict[str, float]:
        if builtin := [name for name in custom if name in ("CPU", "GPU", "memory", "object_store_memory", "")]:
            raise ValueError(f"'{builtin[0]}' is not a custom resource name (cpus, gpus, memory_gb are built in)")
        return custom


MOVED_TO_OPTIONS = ("tiny", "init_from", "dtype", "endpoint", "api_model", "api_key_env")
"""Keys that were top-level group settings before backends owned their options (``path`` stays a shorthand)."""


class GroupAlgorithmConfig(Strict):
    """Per-group overrides of the update settings in ``algorithm``; unset (null) keys inherit."""

    loss: Optional[str] = Field(None, description="policy loss for this group")
    loss_params: Optional[dict[str, Any]] = Field(None, description="keyword-only parameters of this group's policy "
                                                  "loss")
    loss_agg_mode: Optional[str] = Field(None, description="how token losses are reduced for this group")
    clip_ratio: Optional[float] = Field(None, gt=0, description="PPO clip range for this group")
    clip_ratio_low: Optional[float] = Field(None, gt=0, description="lower clip range for this group")
    clip_ratio_high: Optional[float] = Field(None, gt=0, description="upper clip range for this group")
    kl_coef: Optional[float] = Field(None, ge=0, description="KL-to-reference weight for this group")
    kl_type: Optional[str] = Field(None, description="KL estimator for this group")
    entropy_coef: Optional[float] = Field(None, ge=0, description="entropy bonus weight for this group")
    ppo_epochs: Optional[int] = Field(None, ge=1, description="passes over a step's turns for this group")
    mini_batch_size: Optional[int] = Field(None, ge=0, description="turns per optimiser step for this group")
    max_staleness: Optional[int] = Field(None, ge=0, description="most weight versions a trained turn of this "
                                         "group may lag its weights")
    stale_turns: Optional[Literal["drop", "reweight"]] = Field(None, description="turns of this group past its "
                                                               "`max_staleness`: drop or reweight")
    importance_cap: Optional[float] = Field(None, gt=0, description="truncation of this group's importance ratio")


class SnapshotConfig(Strict):
    """Self-play against earlier selves: this frozen group plays snapshots of a trainable group."""

    of: str = Field(..., description="the trainable model group whose weights are snapshotted")
    every: int = Field(10, ge=1, description="take a snapshot of `of` and refresh this group every this many steps")
    pool: int = Field(4, ge=1, description="how many of the newest snapshots the opponent is drawn from")
    pick: Literal["uniform", "latest"] = Field("uniform", description="which pooled snapshot is played after a "
                                               "refresh: drawn uniformly (seeded), or always the newest")


class CriticConfig(Strict):
    """A learned value model for this group's turns (PPO with GAE, ``algorithm.estimator: gae``; docs/critic.md)."""

    path: Optional[str] = Field(None, description="local Hugging Face model dir of a separate (smaller) critic "
                                "backbone with the group's tokenizer; null = a copy of the group's initial backbone")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="the critic's own AdamW and learning-rate "
                               "schedule (one schedule step per update call)")
    value_clip: float = Field(0.5, gt=0, description="clip range of new values around the values before the "
                              "update (verl `cliprange_value`)")


class ModelGroupConfig(Strict):
    """One set of weights. Several roles may map to it."""

    backend: str = Field("torch", description="registered backend that builds the group (`unimas plugins`)")
    options: dict[str, Any] = Field(default_factory=dict, description="backend settings, validated by the backend "
                                    "(see Backend options below); `path` and `init_from` are relative to the "
                                    "config file; `models.<group>.path: DIR` is shorthand for `options: {path: DIR}`")
    trainable: bool = Field(True, description="false = frozen: the group only generates; its roles are frozen too")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimiser and learning-rate schedule")
    lora: Optional[LoraConfig] = Field(None, description="set to allow LoRA adapters per role on this group")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Ray reservation and device")
    algorithm: GroupAlgorithmConfig = Field(default_factory=GroupAlgorithmConfig,
                                            description="overrides of `algorithm` update settings for this group")
    snapshot: Optional[SnapshotConfig] = Field(None, description="make this frozen group an opponent pool: it "
                                               "plays snapshots of a trainable group (self-play)")
    critic: Optional[CriticConfig] = Field(None, description="a learned value model for this group's turns "
                                           "(needed by estimators that take values, e.g. gae; docs/critic.md)")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """``path: DIR`` stays a shorthand of ``options: {path: DIR}``: the one setting nearly every model has."""
        if isinstance(data, dict):
            moved = [key for key in MOVED_TO_OPTIONS if key in data]
            if moved:
                raise ValueError(f"{', '.join(moved)} moved under 'options:' (backend settings), e.g. "
                                 f"options: {{{moved[0]}: ...}}")
            options = data.get("options") or {}
            if "path" in data and isinstance(options, dict):
                if "path" in options:
                    raise ValueError("'path' and 'options.path' both name the model directory; keep one of them")
                data = {**{k: v for k, v in data.items() if k != "path"}, "options": {**options, "path": data["path"]}}
        return data


class GenerationConfig(Strict):
    """Sampling settings of one role's turns."""

    max_new_tokens: int = Field(16, ge=1, description="longest response, in tokens")
    temperature: float = Field(1.0, ge=0, description="sampling temperature; 0 = greedy")
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens; 0 = no limit")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 = no limit")
    require_eos: bool = Field(True, description="no EOS within max_new_tokens = format error")


class ParserConfig(Strict):
    """A registered output parser and its parameters (``unimas plugins`` lists them)."""

    name: str = Field(..., description="parser name: regex, tagged, boxed, json, code, first_line, last_number, "
                      "or a plugin's")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the parser, e.g. "
                                   "{pattern: ...} for regex, {tag: answer} for tagged, {required: [...]} for json")


class RoleConfig(Strict):
    """A logical agent: a prompt template on top of a model group."""

    model: str = Field(..., description="name of the model group (key of `models`) that generates its turns")
    adapter: Optional[str] = Field(None, description="LoRA adapter name; needs `lora` on the model group")

    system: str = Field("", description="the system message (chat models); prepended to the prompt otherwise")
    template: Optional[str] = Field(None, description="Python format string over the task and workflow variables, "
                                    "e.g. 'S:{target}'; required unless `workflow.agent` writes the messages")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="sampling while training")
    eval_generation: Optional[GenerationConfig] = Field(None, description="settings for greedy evaluation "
                                                        "(`eval_samples: 1`); null = `generation`")
    trainable: bool = Field(True, description="false = the role acts but its turns are never trained on; false "
                            "by default on a frozen group")
    parser: Optional[ParserConfig] = Field(None, description="how the answer is read from the output; a plain "
                                           "string is a regex; null = the stripped text")
    memory: Literal["none", "own", "shared"] = Field(
        "none", description="earlier turns in the prompt: none; own (the role's turns as a conversation); "
        "shared (the episode's transcript)")
    chat: Literal["auto", "off"] = Field("auto", description="auto: use the tokenizer's chat template when it has "
                                         "one; off: plain text prompts")
    truncation: Literal["left", "error"] = Field(
        "left", description="a prompt longer than the context: left = keep its end (counted per role); "
        "error = the turn fails its episode")
    entropy_coef: Optional[float] = Field(None, ge=0, description="entropy bonus weight on this role's tokens; "
                                          "null = its group's `algorithm.entropy_coef` (per-role exploration on a "
                                          "shared or LoRA group; docs/credit.md)")
    loss_weight: float = Field(1.0, gt=0, description="multiplier of this role's tokens in its group's loss "
                               "(policy, entropy and KL terms); 1 = as every other role (docs/credit.md)")

    @field_validator("parser", mode="before")
    @classmethod
    def _regex_shorthand(cls, value: Any) -> Any:
        return {"name": "regex", "params": {"pattern": value}} if isinstance(value, str) else value

    @field_validator("adapter")
    @classmethod
    def _safe_adapter(cls, value: Optional[str]) -> Optional[str]:
        return value if value is None else safe_name(value, "adapter name")


class GraphNodeConfig(Strict):
    """One step of a graph workflow: a role's turn (``llm``) or a tool call (``tool``)."""

    kind: Literal["llm", "tool"] = Field(..., description="`llm` runs `role`; `tool` calls `tool`")
    role: Optional[str] = Field(None, description="role that acts (llm nodes only)")
    tool: Optional[str] = Field(None, description="registered tool to call (tool nodes only)")
    inputs: dict[str, str] = Field(default_factory=dict, description="template var / tool argument -> expression")
    max_visits: int = Field(1, ge=1, description="times the node may run in one episode (> 1 allows loops)")


class GraphEdgeConfig(Strict):
    """A transition; a node's edges are tried in order and the first allowed one is followed."""

    source: str = Field(..., alias="from", description="node the edge leaves")
    target: str = Field(..., alias="to", description="node the edge enters")
    when: Optional[str] = Field(None, description="condition expression; null = always")
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class GraphConfig(Strict):
    """An inline workflow: nodes, edges and the outcome expressions (see ``unimas.workflow.graph``)."""

    start: str = Field(..., description="node that runs first")
    nodes: dict[str, GraphNodeConfig] = Field(..., description="node name -> node")
    edges: list[GraphEdgeConfig] = Field(default_factory=list, description="transitions, tried in order")
    outcome: dict[str, str] = Field(default_factory=dict, description="outcome key -> expression")
    max_steps: int = Field(32, ge=1, description="most node runs per episode")


class AgentConfig(Strict):
    """An existing agent program trained through the OpenAI-compatible gateway (docs/gateway.md).

    Per episode it gets the task and a base URL whose ``/chat/completions``
    turns ``model: <role>`` into a turn of that role.
    """

    command: Optional[list[str]] = Field(None, description="program run per episode (cwd = where unimas runs): task "
                                         "JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY in its environment, "
                                         "outcome JSON object as the last line of stdout")
    function: Optional[str] = Field(None, description="`pkg.module:run`, an `async def run(task, base_url) -> dict` "
                                    "called per episode in the trainer's process")
    timeout_s: float = Field(300.0, gt=0, description="an agent running longer is stopped and its episode fails")
    host: str = Field("127.0.0.1", description="gateway address; wherever it listens, a `command` agent's "
                      "requests need its episode's own token (given to it as OPENAI_API_KEY); a `function` agent "
                      "needs a loopback address")
    port: int = Field(0, ge=0, le=65535, description="gateway port; 0 = a free port")
    _config_dir: Optional[str] = PrivateAttr(None)
    """The directory of the config file (set when loaded from one): `function` modules are also looked up there."""

    @model_validator(mode="after")
    def _one_kind(self) -> "AgentConfig":
        if (self.command is None) == (self.function is None):
            raise ValueError("give exactly one of 'command' (a program) or 'function' (pkg.module:run)")
        if self.command is not None and not self.command:
            raise ValueError("'command' is empty: give the program and its arguments, e.g. [python, agent.py]")
        if self.function is not None and ":" not in self.function:
            raise ValueError(f"'function' {self.function!r} must look like pkg.module:run")
        return self


class WorkflowConfig(Strict):
    """How one episode runs: a registered Python workflow (``name``), an inline ``graph`` or an ``agent`` program."""

    name: Optional[str] = Field(None, description="registered workflow (`unimas plugins`)")
    graph: Optional[GraphConfig] = Field(None, description="inline declarative workflow")
    agent: Optional[AgentConfig] = Field(None, description="an agent program reached through the OpenAI-compatible "
                                         "gateway (docs/gateway.md)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments bound to the workflow")

    @model_validator(mode="after")
    def _one_kind(self) -> "WorkflowConfig":
        if sum(kind is not None for kind in (self.name, self.graph, self.agent)) != 1:
            raise ValueError("give exactly one of 'name' (registered), 'graph' (inline) or 'agent' (a program)")
        if self.agent is not None and self.params:
            raise ValueError("'params' bind a named workflow's arguments; an agent gets the task row")
        return self


class DataConfig(Strict):
    """The task source: a registered dataset called with ``split``, ``seed`` and ``params``."""

    name: str = Field(..., description="registered dataset (`unimas plugins`)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the dataset")
    eval_params: Optional[dict[str, Any]] = Field(None, description="arguments for the eval split; null = `params`")


class RewardConfig(Strict):
    """One reward term; a turn's reward is the weighted sum of the terms that reach it."""

    name: str = Field(..., description="registered reward function (`unimas plugins`)")
    level: Literal["trajectory", "role", "turn"] = Field(
        "trajectory", description="what the function scores: the episode, each role, or each turn")
    weight: float = Field(1.0, description="multiplier of this term in the summed reward")
    roles: Optional[list[str]] = Field(None, description="roles that receive it; default all")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the reward function")


class AlgorithmPlugin(BaseModel):
    """A registered algorithm plugin (rollout control, replay, update order or credit shaper) and its parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="registered name (`unimas plugins` lists them)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the plugin's factory")


class AlgorithmConfig(Strict):
    """Credit assignment and the policy update (names resolve in plugins, then verl's registries)."""

    estimator: str = Field("grpo", description="advantage estimator: a plugin's or verl's (grpo, rloo, ...)")
    estimator_params: dict[str, Any] = Field(default_factory=dict, description="keyword-only parameters of the "
                                             "estimator (`unimas plugins --verbose` lists them)")
    grouping: Literal["role", "role_turn", "trajectory"] = Field(
        "role", description="turns normalised together per task: by role, by role and turn index, or all")
    group_size: int = Field(8, ge=1, description="episodes per task per step (G)")
    norm_by_std: bool = Field(True, description="divide group-centred rewards by the group std")
    loss: str = Field("vanilla", description="policy loss: a plugin's or verl's (vanilla = PPO clip, gspo, ...)")
    loss_params: dict[str, Any] = Field(default_factory=dict, description="keyword-only parameters of the policy "
                                        "loss, e.g. m2po's `tau` (`unimas plugins --verbose` lists them)")
    loss_agg_mode: str = Field("token-mean", description="verl reduction of token losses: token-mean, token-sum, "
                               "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm")
    clip_ratio: float = Field(0.2, gt=0, description="PPO clip range (both sides unless overridden)")
    clip_ratio_low: Optional[float] = Field(None, gt=0, description="lower clip range; null = `clip_ratio`")
    clip_ratio_high: Optional[float] = Field(None, gt=0, description="upper clip range; null = `clip_ratio`")
    kl_coef: float = Field(0.0, ge=0, description="weight of KL to the initial (reference) policy; 0 = off")
    kl_type: str = Field("low_var_kl", description="KL estimator: kl/k1, abs, mse/k2, low_var_kl/k3")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight; 0 = off")
    ppo_epochs: int = Field(1, ge=1, description="passes over a step's turns")
    mini_batch_size: int = Field(0, ge=0, description="turns per optimiser step; 0 = whole batch")
    gamma: float = Field(1.0, ge=0, le=1, description="discount handed to the estimator (verl `AlgoConfig.gamma`)")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda of estimators that take values (gae): 0 = one-step "
                       "TD, 1 = the whole return (docs/critic.md)")
    gae_reward: Literal["last_turn", "every_turn"] = Field(
        "last_turn", description="GAE over a role's turns: the credit scalar on the role's last turn only, or each "
        "turn's on its own last token (docs/critic.md)")
    critic_warmup: int = Field(0, ge=0, description="first update calls of each group in which only its critic "
                               "trains")
    critic: Literal["per_group", "centralized"] = Field(
        "per_group", description="where values come from (estimators that take values): each group's own critic "
        "(`models.<g>.critic`), or one centralized critic group that reads the whole episode so far "
        "(`central_critic`; docs/critic.md)")
    central_critic: Optional[str] = Field(None, description="with `critic: centralized`: the model group (a torch "
                                          "group with a `critic` section and no roles) that values every role's "
                                          "turns")
    rollout: Optional[AlgorithmPlugin] = Field(None, description="rollout control (null: `group_size` episodes/task)")
    replay: Optional[AlgorithmPlugin] = Field(None, description="replay buffer mixed into groups (null: none)")
    update_order: Optional[AlgorithmPlugin] = Field(None, description="update order of roles (null: all parallel)")
    credit: Optional[AlgorithmPlugin] = Field(None, description="credit shaper: per-turn signal, keys (null: reward)")
    max_staleness: int = Field(0, ge=0, description="asynchronous pipeline: most weight versions a trained turn may "
                               "lag its group (rollouts run that many steps ahead of updates); 0 = synchronous")
    stale_turns: Literal["drop", "reweight"] = Field(
        "drop", description="turns past a group's `max_staleness`: drop them, or train them importance-reweighted")
    importance_cap: float = Field(2.0, gt=0, description="stale turns train with min(current/behaviour prob, this) "
                                  "per token (truncated importance ratio against the sampled log-probs)")


class StopCondition(Strict):
    """Ends training early (with a checkpoint) once ``metric`` crosses a threshold in a logged record."""

    metric: str = Field(..., description="any metric name in metrics.jsonl, e.g. eval/accuracy or reward/mean")
    at_least: Optional[float] = Field(None, description="stop when metric >= this")
    at_most: Optional[float] = Field(None, description="stop when metric <= this")

    @model_validator(mode="after")
    def _one_bound(self) -> "StopCondition":
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("give exactly one of 'at_least' or 'at_most'")
        return self

    def reached(self, record: dict[str, Any]) -> bool:
        value = record.get(self.metric)
        if not isinstance(value, (int, float)):
            return False
        return value >= self.at_least if self.at_least is not None else value <= self.at_most


class TrainerConfig(Strict):
    """The training loop: steps, evaluation, checkpoints, early stop."""

    steps: int = Field(100, ge=0, description="training steps: rollouts, then one update per trainable group")
    seed: int = Field(0, ge=0, lt=2**31, description="seeds task sampling, the dataset and torch")
    tasks_per_step: int = Field(32, ge=1, description="tasks sampled per step; each runs `group_size` episodes")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps; 0 = only at the end")
    eval_every: int = Field(10, ge=0, description="evaluate every N steps; 0 = only at start and end")
    eval_size: int = Field(64, ge=1, description="most eval tasks used (the first N of the eval split)")
    eval_samples: int = Field(1, ge=1, description="episodes per eval task; 1 = greedy, >1 samples and reports pass@k")
    sample_trajectories: int = Field(4, ge=0, description="trajectories per step written to JSONL; 0 = none")
    torch_threads: int = Field(1, ge=1, description="torch CPU threads per process")
    stop_at_accuracy: Optional[float] = Field(None, ge=0, le=1, description="shorthand for stop_when: "
                                              "{metric: eval/accuracy, at_least: X}")
    stop_when: Optional[StopCondition] = Field(None, description="end early once a logged metric crosses a threshold")
    failure_budget: float = Field(0.5, ge=0, le=1, description="max fraction of failed episodes in a step; a "
                                  "step over it skips its update")
    no_turn_budget: float = Field(0.5, ge=0, le=1, description="max fraction of a step's episodes that made no "
                                  "model turn (an agent answering from a client-side cache); a step over it skips its "
                                  "update and counts as over `failure_budget`")
    max_failed_steps: int = Field(1, ge=1, description="consecutive steps over `failure_budget` that stop the run "
                                  "(1 = the first one)")
    on_nonfinite: Literal["skip", "stop"] = Field("skip", description="a NaN/inf advantage or loss: `skip` that "
                                                  "update (counted in metrics) or `stop` the run")
    keep_checkpoints: int = Field(0, ge=0, description="complete checkpoints kept, newest first; 0 = all")


class RuntimeConfig(Strict):
    """Where model groups run and how generation requests are batched."""

    kind: Literal["local", "ray"] = Field("local", description="`local`: groups in this process; `ray`: one actor each")
    max_batch_size: int = Field(256, ge=1, description="requests to one group flushed as one batch")
    max_wait_ms: float = Field(5.0, ge=0, description="longest a request waits for its batch to fill, in ms")
    max_concurrent_episodes: int = Field(1024, ge=1, description="episodes running at once")
    address: Optional[str] = Field(None, description="Ray cluster to join (auto, host:port, ray://...); "
                                   "null = start a private local one")
    restart_failed_groups: bool = Field(False, description="restart a failed group from the last checkpoint "
                                        "and retry once, instead of stopping the run")
    tool_timeout_s: float = Field(60.0, gt=0, description="a tool call running longer fails (recorded on its node)")
    episode_timeout_s: float = Field(600.0, gt=0, description="an episode running longer fails (recorded); "
                                     "bounds workflows that never return")


class EntropyWarningConfig(Strict):
    """When to warn that a trainable role stopped exploring (``role/<role>/entropy``, docs/metrics.md)."""

    below: float = Field(0.05, ge=0, description="a role's mean token entropy (nats) under this counts as low")
    steps: int = Field(5, ge=1, description="consecutive low steps before the one warning for that role")


class LoggingConfig(Strict):
    """Where metrics go besides ``metrics.jsonl`` in the run directory."""

    console: bool = Field(True, description="live progress and metrics in the terminal")
    tensorboard: bool = Field(False, description="TensorBoard events under `RUN_DIR/tensorboard`")
    wandb: Optional[dict[str, Any]] = Field(None, description="Weights & Biases: these keys go to `wandb.init`; "
                                            "null = off")
    report: bool = Field(True, description="write report.html and plots when training ends")
    entropy_warning: Optional[EntropyWarningConfig] = Field(
        default_factory=EntropyWarningConfig, description="one warning per trainable role whose entropy stays "
        "below `below` for `steps` steps in a row (a collapsed role); null = off")


class ExperimentConfig(Strict):
    """A whole experiment: one YAML file."""

    name: str = Field("experiment", description="run name; run directories are `runs/<name>-<timestamp>`")
    plugins: list[str] = Field(default_factory=list, description="extra plugin modules to import, besides "
                               "installed entry points")
    models: dict[str, ModelGroupConfig] = Field(..., min_length=1, description="model group name -> weights")
    roles: dict[str, RoleConfig] = Field(..., min_length=1, description="role name -> agent")
    workflow: WorkflowConfig = Field(..., description="how one episode runs")
    data: DataConfig = Field(..., description="where tasks come from")
    rewards: list[RewardConfig] = Field(default_factory=list, description="reward terms, summed per turn")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="credit and policy update")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="the training loop")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="where groups run, batching")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="metric sinks")

    @field_validator("name")
    @classmethod
    def _safe_run_name(cls, value: str) -> str:
        return safe_name(value, "run name")

    @field_validator("models")
    @classmethod
    def _safe_group_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for group in value:
            safe_name(group, "model group name")
        return value

    @model_validator(mode="after")
    def _frozen_groups_freeze_their_roles(self) -> "ExperimentConfig":
        """One flag freezes a group's roles; an explicit ``trainable: true`` stays, for `unimas validate` to refuse."""
        for role in self.roles.values():
            group = self.models.get(role.model)
            if group is not None and not group.trainable and "trainable" not in role.model_fields_set:
                role.trainable = False
        return self

    @property
    def stop_condition(self) -> Optional[StopCondition]:
        """``trainer.stop_when``, or the ``stop_at_accuracy`` shorthand spelled out."""
        if self.trainer.stop_when is not None:
            return self.trainer.stop_when
        if self.trainer.stop_at_accuracy is not None:
            return StopCondition(metric="eval/accuracy", at_least=self.trainer.stop_at_accuracy)
        return None

    def algorithm_for(self, group: str) -> AlgorithmConfig:
        """The global ``algorithm`` with ``models.<group>.algorithm`` overrides applied."""
        overrides = self.models[group].algorithm.model_dump(exclude_none=True)
        return self.algorithm.model_copy(update=overrides) if overrides else self.algorithm
