"""The KV layout is learned from what llama-server reports, or the contradiction is said."""

from __future__ import annotations

from pathlib import Path

from gate.backend.layout import learn_layout, local_server_args, parse_server_args
from gate.backend.pool import budget_floor, capacity_from_props, capacity_notes, capacity_warnings, reserved_total
from gate.config import BackendConfig, BudgetConfig, ClassConfig


def props(slots: int, per_slot: int) -> dict:
    return {"total_slots": slots, "default_generation_settings": {"n_ctx": per_slot}}


def argv(*flags: str) -> list[str]:
    return ["/opt/llama/bin/llama-server", "-m", "model.gguf", "--port", "8080", *flags]


def test_a_context_llama_server_rounded_up_per_slot_is_said_with_true_arithmetic():
    # -np 4 -c 512: llama-server gives each slot 256 (its rounding up), 1,024 in all; the line read
    # "4 x 256 = the total 512" beside a ceiling of 1,024 (a trial: "is my pool 512 or 1024?")
    layout = learn_layout(props(4, 256), "auto", parse_server_args(argv("-np", "4", "-c", "512")))
    assert layout.kv == "split" and "4 x 256 = 1024, -c 512 rounded up per slot" in layout.detail
    assert capacity_from_props(props(4, 256), BackendConfig(), layout).ceiling == 1024


def test_split_server_per_slot_context_against_its_total_gives_the_whole_pool_even_when_config_says_unified():
    args = parse_server_args(argv("-np", "4", "-c", "2048"))
    for configured in ("auto", "unified"):
        layout = learn_layout(props(4, 512), configured, args)
        assert (layout.kv, layout.source) == ("split", "process")
        assert capacity_from_props(props(4, 512), BackendConfig(kv=configured), layout).ceiling == 2048
    assert not learn_layout(props(4, 512), "auto", args).warnings
    (warning,) = learn_layout(props(4, 512), "unified", args).warnings
    assert 'config says kv = "unified"' in warning and "split" in warning


def test_unified_server_is_learned_by_flags_or_by_every_slot_seeing_the_total():
    cases = [
        (argv("-np", "3", "-c", "3000", "-kvu"), props(3, 3000)),
        (argv("--parallel=6", "--ctx-size", "6144", "--kv-unified"), props(6, 6144)),
        (argv("-c", "4096"), props(4, 4096)),  # -np auto: 4 slots sharing the pool
        (argv(), props(4, 4096)),  # no -c: the total is unknown; -np auto says unified
    ]
    for flags, p in cases:
        layout = learn_layout(p, "split", parse_server_args(flags))
        assert layout.kv == "unified", flags
        assert capacity_from_props(p, BackendConfig(kv="split"), layout).ceiling == p["default_generation_settings"]["n_ctx"]
        assert layout.warnings and 'config says kv = "split"' in layout.warnings[0]


def test_ctx_zero_takes_the_models_training_context_as_the_total():
    layout = learn_layout(props(2, 2048), "auto", parse_server_args(argv("-np", "2", "-c", "0")), n_ctx_train=4096)
    assert layout.kv == "split"  # 2 x 2048 = 4096: the slots split the total


def test_a_unified_pool_whose_slots_are_capped_below_it_stays_unified_never_counted_twice():
    # llama-server -c 8192 (-np auto) on a model trained for 4096 logs "n_ctx_slot = 4096,
    # kv_unified = 'true'": one pool of 8192. Counted as split (4 x 4096 >= 8192) the gate's
    # ceiling was 16384, and four 2,600-token requests it admitted together all failed with
    # "Context size has been exceeded". -kvu with --kv-unified-per-slot capping a slot is the same.
    cases = [
        (argv("-c", "8192"), props(4, 4096), 8192),
        (argv("-np", "4", "-c", "8192", "-kvu"), props(4, 4096), 8192),
        (argv("-np", "2", "-c", "0", "-kvu"), props(2, 2048), 4096),
    ]
    for flags, p, pool in cases:
        layout = learn_layout(p, "auto", parse_server_args(flags), n_ctx_train=4096)
        assert (layout.kv, layout.source) == ("unified", "process"), flags
        cap = capacity_from_props(p, BackendConfig(kv="auto"), layout)
        assert cap.ceiling == pool and cap.slot_context == p["default_generation_settings"]["n_ctx"], flags


def test_environment_variables_count_like_flags():
    args = parse_server_args(
        ["llama-server", "-m", "m.gguf"], {"LLAMA_ARG_N_PARALLEL": "4", "LLAMA_ARG_CTX_SIZE": "8192", "LLAMA_ARG_PORT": "9000"}
    )
    assert (args.n_parallel, args.ctx, args.port) == (4, 8192, 9000)
    assert learn_layout(props(4, 2048), "auto", args).kv == "split"


def test_an_unlearnable_layout_is_assumed_unified_and_said_with_the_figure_it_would_be():
    layout = learn_layout(props(4, 512), "auto", None)
    assert (layout.kv, layout.source) == ("unified", "assumed")
    (warning,) = layout.warnings
    assert "512" in warning and "2048" in warning and 'kv = "split"' in warning
    # an operator's explicit setting holds, unwarned, where nothing contradicts it
    assert learn_layout(props(4, 512), "split", None).warnings == ()
    assert learn_layout(props(4, 512), "split", None).kv == "split"
    # one slot: its context is the pool whatever the config says
    assert learn_layout(props(1, 512), "auto", None).warnings == ()


def test_local_server_args_finds_the_one_llama_server_on_the_backends_port(tmp_path: Path):
    def proc(pid: int, *args: str) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")

    proc(100, "/usr/bin/python3", "-m", "http.server", "--port", "8080")
    proc(200, "/build/bin/llama-server", "-m", "m.gguf", "--port", "8081", "-np", "4", "-c", "2048")
    proc(300, "/build/bin/llama-server", "-m", "m.gguf", "-np", "2")  # default port 8080
    (tmp_path / "self").mkdir()
    found = local_server_args("http://127.0.0.1:8081", proc_root=str(tmp_path))
    assert found is not None and (found.pid, found.n_parallel, found.ctx) == (200, 4, 2048)
    assert local_server_args("http://localhost:8080", proc_root=str(tmp_path)).pid == 300
    assert local_server_args("http://127.0.0.1:9999", proc_root=str(tmp_path)) is None
    assert local_server_args("http://10.0.0.7:8081", proc_root=str(tmp_path)) is None  # not this host
    assert local_server_args("http://127.0.0.1:8081", proc_root=str(tmp_path / "absent")) is None


def test_min_tokens_and_reservations_above_the_ceiling_are_said():
    layout = learn_layout(props(4, 512), "auto", None)
    cap = capacity_from_props(props(4, 512), BackendConfig(), layout)
    classes = (
        ClassConfig(name="interactive", priority=2, reserved_tokens=1024, default_max_tokens=256),
        ClassConfig(name="batch", priority=1, default_max_tokens=256),
    )
    warnings = capacity_warnings(layout, cap, BudgetConfig(min_tokens=2048), classes)
    assert any("min_tokens 2048 is above the ceiling 512" in w for w in warnings)
    (scaled,) = [w for w in warnings if "class reservations" in w]
    assert "(interactive 1024) are over 50% of the ceiling 512" in scaled
    assert ": interactive 256 in force here" in scaled
    fits = capacity_from_props(props(4, 512), BackendConfig(kv="split"), learn_layout(props(4, 512), "split", None))
    # min_tokens at the ceiling: no longer above it, but the adaptive budget cannot move (#25)
    (warning,) = capacity_warnings(None, fits, BudgetConfig(min_tokens=2048), classes)
    assert "no room" in warning and "budget.min_tokens 2048" in warning
    assert capacity_warnings(None, fits, BudgetConfig(min_tokens=1024), classes) == ()


def test_a_token_budget_above_the_pool_is_said():
    # `config check` printed "ceiling 99999999" against a 2,048-token pool and nothing else
    layout = learn_layout(props(4, 512), "split", None)
    classes = (ClassConfig(name="batch", priority=1, default_max_tokens=64),)
    over = capacity_from_props(props(4, 512), BackendConfig(kv="split", token_budget=99_999_999), layout)
    assert (over.ceiling, over.pool) == (99_999_999, 2048)
    (warning,) = capacity_warnings(layout, over, BudgetConfig(min_tokens=0), classes)
    assert "token_budget 99999999 is above llama-server's KV pool of 2048" in warning
    under = capacity_from_props(props(4, 512), BackendConfig(kv="split", token_budget=1024), layout)
    assert capacity_warnings(layout, under, BudgetConfig(min_tokens=0), classes) == ()  # below the pool: a choice


def test_a_default_max_tokens_no_request_can_fit_in_a_slot_is_noted_with_what_the_gate_does():
    layout = learn_layout(props(4, 512), "split", None)
    cap = capacity_from_props(props(4, 512), BackendConfig(kv="split"), layout)
    classes = (ClassConfig(name="batch", priority=1, default_max_tokens=512), ClassConfig(name="chat", priority=2, default_max_tokens=256))
    assert capacity_warnings(layout, cap, BudgetConfig(min_tokens=512), classes) == ()  # handled: not a warning
    (note,) = capacity_notes(cap, classes)
    assert "classes.batch.default_max_tokens 512" in note and "what its slot holds after its prompt" in note
    assert capacity_notes(cap, (ClassConfig(name="batch", priority=1, default_max_tokens=511),)) == ()


def test_reservations_are_scaled_to_a_small_pool_and_said_so_every_class_and_the_controller_keep_room():
    """#25, tried as a user: `llama-server -np 2 -c 1024` and the example config. interactive's
    1,024-token reservation was the whole pool: batch could never start (400 on every request),
    and the adaptive budget's floor (the reservations) was its ceiling. R0: at most half the
    ceiling is reserved, so on that pool interactive reserves 512, and the gate says so."""
    layout = learn_layout(props(2, 1024), "unified", None)
    cap = capacity_from_props(props(2, 1024), BackendConfig(kv="unified"), layout)
    assert cap.ceiling == 1024
    example = (
        ClassConfig(name="interactive", priority=10, reserved_tokens=1024, default_max_tokens=256),
        ClassConfig(name="batch", priority=1, default_max_tokens=256),
    )
    (scaled,) = capacity_warnings(layout, cap, BudgetConfig(mode="adaptive", min_tokens=0), example)
    assert "interactive 512 in force here" in scaled and "keep room" in scaled
    assert budget_floor(BudgetConfig(min_tokens=0), cap.ceiling, reserved_total(example, cap.ceiling)) == 512
    # Room for a default request of each class and for the controller: nothing to say.
    roomy = capacity_from_props(props(4, 4096), BackendConfig(kv="unified"), learn_layout(props(4, 4096), "unified", None))
    assert capacity_warnings(None, roomy, BudgetConfig(mode="adaptive", min_tokens=0), example) == ()
    # Within half the ceiling, a class whose default request cannot fit beside the others'
    # reservations is still told so; the boundary: the others leave exactly default_max_tokens,
    # which no request with a prompt fits.
    long_batch = ClassConfig(name="batch", priority=1, default_max_tokens=512)
    tight = (ClassConfig(name="interactive", priority=10, reserved_tokens=512, default_max_tokens=256), long_batch)
    (edge,) = capacity_warnings(None, cap, BudgetConfig(mode="static", min_tokens=0), tight)
    assert "may hold at most 512 tokens" in edge and "lower reserved_tokens or default_max_tokens" in edge
    tight = (ClassConfig(name="interactive", priority=10, reserved_tokens=511, default_max_tokens=256), long_batch)
    assert capacity_warnings(None, cap, BudgetConfig(mode="static", min_tokens=0), tight) == ()
    # An operator's min_tokens at the ceiling still leaves the controller no room, and is said.
    (stuck,) = capacity_warnings(None, cap, BudgetConfig(mode="adaptive", min_tokens=1024), example[1:])
    assert "no room" in stuck and "budget.min_tokens 1024" in stuck


def test_during_a_restart_the_llama_server_started_last_is_the_one_that_listens(tmp_path: Path):
    # the old process finishes its running tasks (~30 s) after letting the port go; two matched
    # and the layout was "not known", assumed unified: a trial's gate ran at 512 of a 2,048-token
    # split pool until the server's next restart
    def proc(pid: int, started: int | None, *args: str) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
        if started is not None:  # pid (comm) state ppid ... field 22: the start time
            (d / "stat").write_text(f"{pid} (llama server) S 1 " + " ".join(["0"] * 17) + f" {started} 0 0\n")

    proc(400, 5000, "/build/bin/llama-server", "-m", "m.gguf", "--port", "8081", "-np", "4", "-c", "1024")  # old, exiting
    proc(500, 9000, "/build/bin/llama-server", "-m", "m.gguf", "--port", "8081", "-np", "4", "-c", "2048")  # new
    found = local_server_args("http://127.0.0.1:8081", proc_root=str(tmp_path))
    assert found is not None and (found.pid, found.ctx) == (500, 2048)
    proc(600, None, "/build/bin/llama-server", "-m", "m.gguf", "--port", "8081")  # its start time unknown
    assert local_server_args("http://127.0.0.1:8081", proc_root=str(tmp_path)) is None
