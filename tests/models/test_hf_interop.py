"""diffattn at the borders of the Hugging Face ecosystem (issue 26): importing diffattn never breaks an import of
transformers and registers its model types with the Auto classes in every import order; a saved DIFF model reloads
exactly through every diffattn path and is never loaded silently wrong by plain transformers; ``output_attentions``
returns the maps whether asked by keyword or by the config.

The import orders need fresh interpreters: one driver subprocess imports torch once and forks a child per order
(the cost of a case is then transformers' imports, not an interpreter start).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, DiffLlamaForCausalLM

from diffattn.adapters.runs import load_adapted
from diffattn.eval.suite import load_for_eval
from diffattn.models import DiffLlamaDifferentialAttention, build_model, install_diff_attention
from diffattn.models.pretrained import load_pretrained

VOCAB = 100
# the options of a DIFF model: the default (plain DiffLlama computes it) and the three it does not compute
DIFF_OPTIONS = {
    "default": {},
    "lambda_init-0.5": {"lambda_init": 0.5},
    "norm-none": {"norm": "none"},
    "norm-rms_affine": {"norm": "rms_affine"},
}


def _ids(b=2, t=9, seed=0):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _save_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)


def _diff_model(options: dict):
    """A DIFF model with ``options`` whose λ vectors (and norm gains) are far from their initial values, so every
    option changes the logits."""
    model = build_model("debug", "diff", seed=0, vocab_size=VOCAB, **options).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lambda_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif "groupnorm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every DIFF option and a DIFF V2 model saved with a tokenizer, and the logits each must give (``want.pt``)."""
    root = tmp_path_factory.mktemp("saved")
    ids = _ids()
    models = {name: _diff_model(options) for name, options in DIFF_OPTIONS.items()}
    models["diff-v2"] = build_model("debug", "diff-v2", seed=0, vocab_size=VOCAB).eval()
    want = {}
    for name, model in models.items():
        model.save_pretrained(root / name)
        _save_tokenizer(root / name)
        with torch.no_grad():
            want[name] = model(ids).logits
    torch.save({"ids": ids, "logits": want}, root / "want.pt")
    return root


# ---------------------------------------------------------------- import orders (fresh interpreters)

MODEL_CLASSES = (
    "LlamaForCausalLM", "DiffLlamaForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel", "AutoModelForCausalLM"
)  # fmt: skip

# modules that import transformers first from inside diffattn's model modules (the Auto classes' registration
# waits until those have executed: diffattn.hf_auto)
FIRST_IMPORTERS = (
    "diffattn.models.diff_llama", "diffattn.models.diff_model", "diffattn.models.diff_v2", "diffattn.models.install",
    "diffattn.train.config",
)  # fmt: skip

DRIVER = textwrap.dedent(
    '''
    import os, sys, time, traceback
    ROOT, CLASSES = sys.argv[1], sys.argv[2:]
    FIRST_IMPORTERS = os.environ["FIRST_IMPORTERS"].split(",")

    def run(name, body):
        """Run ``body`` in a forked child (a fresh import state) and print one result line."""
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            start = time.perf_counter()
            try:
                body()
                print(f"{name}: ok ({time.perf_counter() - start:.1f} s)", flush=True)
                code = 0
            except BaseException:
                print(f"{name}: FAILED\\n{traceback.format_exc()}", flush=True)
                code = 1
            os._exit(code)
        os.waitpid(pid, 0)

    def light():
        import diffattn
        heavy = [m for m in ("torch", "transformers") if m in sys.modules]
        assert not heavy, f"import diffattn imported {heavy}"

    def check_loads(diffattn_imported=True):
        """The Auto classes know every diffattn model type, and each saved model gives its logits (or, without
        diffattn, is either exact or refused with a message naming diffattn)."""
        import torch
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

        want = torch.load(os.path.join(ROOT, "want.pt"))
        for name, logits in want["logits"].items():
            folder = os.path.join(ROOT, name)
            try:
                model = AutoModelForCausalLM.from_pretrained(folder).eval()
            except ValueError as e:
                assert not diffattn_imported, f"{name}: {e}"
                assert "diffattn" in str(e), f"{name}: the refusal does not name diffattn: {e}"
                continue
            with torch.no_grad():
                got = model(want["ids"]).logits
            assert torch.allclose(got, logits, atol=1e-5, rtol=1e-5), f"{name}: {(got - logits).abs().max()}"
            if diffattn_imported:  # AutoConfig and AutoModel know the type too
                base = type(AutoModel.from_config(AutoConfig.from_pretrained(folder))).__name__
                assert base == type(model).__name__.replace("ForCausalLM", "Model"), f"{name}: {base}"
        if diffattn_imported:
            assert type(model).__name__ == "DiffTransformerV2ForCausalLM"

    def diffattn_first(cls):
        def body():
            import diffattn
            exec(f"from transformers import {cls}")
            check_loads()
        return body

    def transformers_first():
        exec(f"from transformers import {', '.join(CLASSES)}")
        import diffattn
        check_loads()

    def bare_transformers_first():
        import transformers
        import diffattn
        check_loads()

    def built_before_the_auto_module():
        import diffattn
        diffattn.build_model("debug", "diff-v2", seed=0)  # before the user imports any Auto class
        check_loads()

    def model_module_first(module):
        """One of diffattn's model modules (or a package importing one) is transformers' first importer: the hook
        finds it half-imported and registers right after it has executed, without a warning."""
        def body():
            import importlib
            import logging
            warned = []
            handler = logging.Handler(logging.WARNING)
            handler.emit = warned.append
            logging.getLogger("diffattn").addHandler(handler)
            importlib.import_module(module)
            assert not warned, [r.getMessage() for r in warned]
            check_loads()
        return body

    def without_diffattn():
        check_loads(diffattn_imported=False)
        assert "diffattn" not in sys.modules

    run("light", light)
    # torch, with the parts of it transformers pulls in, once here: every child starts from this (none of it is
    # transformers or diffattn, whose import orders are under test)
    import torch, torch._dynamo, torch.distributed.tensor, safetensors.torch, tokenizers, huggingface_hub
    for cls in CLASSES:
        run(f"diffattn first, then {cls}", diffattn_first(cls))
    run("transformers first", transformers_first)
    run("bare transformers first", bare_transformers_first)
    run("model built before the Auto module", built_before_the_auto_module)
    for module in FIRST_IMPORTERS:
        run(f"{module} first", model_module_first(module))
    run("without diffattn", without_diffattn)
    '''
)


@pytest.mark.heavy  # > 10 s on 2 cores (tests/durations.json): CI runs it after the default suite
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks a child per import order")
def test_every_import_order_works_and_registers_the_auto_classes(saved):
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(saved), *MODEL_CLASSES], capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "FIRST_IMPORTERS": ",".join(FIRST_IMPORTERS)},
    )  # fmt: skip
    report = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in report, report
    assert report.count(": ok") == len(MODEL_CLASSES) + 5 + len(FIRST_IMPORTERS), report + done.stderr[-3000:]


# ---------------------------------------------------------------- saved DIFF models with options


def _reloads(folder, tmp_path):
    """The model of ``folder`` through every diffattn loading path: a Hugging Face folder (load_pretrained and
    load_for_eval), a pretrain run's final/ (load_for_eval), an adapt run's merged/ and final/ (load_adapted)."""
    pretrain, adapt, control = tmp_path / "pretrain", tmp_path / "adapt", tmp_path / "control"
    shutil.copytree(folder, pretrain / "final")
    (pretrain / "run.yaml").write_text("model: {preset: debug, attention: diff}\n")
    shutil.copytree(folder, adapt / "merged")
    (adapt / "run.yaml").write_text(f"model: {{name: {folder}}}\nmethod: {{name: dex}}\n")
    shutil.copytree(folder, control / "final")
    (control / "run.yaml").write_text(f"model: {{name: {folder}}}\nmethod: {{name: lora}}\n")
    adapted, _, description = load_for_eval(adapt)  # Dex with merged/ alone: read, saying what its maps are
    assert description.endswith("merged/ (no adapter/: the attention suites read the base's maps, not the method's)")
    return {
        "load_pretrained": load_pretrained(folder)[0],
        "load_for_eval(folder)": load_for_eval(folder)[0],
        "load_for_eval(pretrain run)": load_for_eval(pretrain)[0],
        "load_for_eval(adapt run)": adapted,
        "load_adapted(merged)": load_adapted(adapt, merged=True)[0],
        "load_adapted(final)": load_adapted(control)[0],
    }


@pytest.mark.parametrize("name", list(DIFF_OPTIONS))
def test_a_saved_diff_model_reloads_exactly_through_diffattn_and_never_silently_wrong_in_transformers(
    saved, name, tmp_path
):
    want = torch.load(saved / "want.pt")
    ids, logits = want["ids"], want["logits"][name]
    folder = saved / name
    for path, model in _reloads(folder, tmp_path).items():
        with torch.no_grad():
            got = model(ids).logits
        if any(isinstance(m, DiffLlamaDifferentialAttention) for m in model.modules()):  # the saved computation
            assert torch.equal(got, logits), f"{path}: {(got - logits).abs().max()}"
        else:  # HF's own DiffLlama attention (the default options): equal to float rounding
            assert name == "default", path
            torch.testing.assert_close(got, logits, atol=1e-5, rtol=1e-5, msg=lambda m, p=path: f"{p}: {m}")
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    if name == "default":  # plain DiffLlama computes it: still a plain checkpoint, exact in plain transformers
        assert model_type == "diffllama"
        plain = DiffLlamaForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            torch.testing.assert_close(plain(ids).logits, logits, atol=1e-5, rtol=1e-5)
    else:  # a model type plain transformers does not know (the refusal is checked without diffattn above)
        assert model_type == "diffattn_diff"
        assert "import diffattn" in (folder / "README.md").read_text()


def test_the_rms_affine_gains_survive_reinstalling_and_a_checkpoint_written_before_this_type(saved, tmp_path):
    """Re-installing (another backend) keeps the learnt gains; a checkpoint saved as plain ``diffllama`` with
    non-default options (diffattn before the ``diffattn_diff`` type) still reloads exactly through diffattn."""
    want = torch.load(saved / "want.pt")
    ids, logits = want["ids"], want["logits"]["norm-rms_affine"]
    model = AutoModelForCausalLM.from_pretrained(saved / "norm-rms_affine").eval()
    install_diff_attention(model, "reference")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, logits, atol=1e-5, rtol=1e-5)
    legacy = tmp_path / "legacy"
    shutil.copytree(saved / "norm-rms_affine", legacy)
    config = json.loads((legacy / "config.json").read_text())
    (legacy / "config.json").write_text(json.dumps({**config, "model_type": "diffllama"}))
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(legacy)[0](ids).logits, logits, atol=1e-5, rtol=1e-5)


def test_removing_or_resetting_the_options_makes_the_checkpoint_plain_again(tmp_path):
    model = _diff_model({"norm": "none"})
    assert model.config.model_type == "diffattn_diff"
    install_diff_attention(model, norm="rms")
    assert model.config.model_type == "diffllama"
    install_diff_attention(model, lambda_init=0.5)
    assert model.config.model_type == "diffattn_diff"
    from diffattn.models import remove_diff_attention

    remove_diff_attention(model)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "diffllama"


# ---------------------------------------------------------------- output_attentions from the config


@pytest.mark.parametrize("attention", ["diff", "diff-v2"])
def test_the_returned_maps_are_on_the_outputs_gradient_path(attention):
    """issue 36 §8: transformers' test_retain_grad_hidden_states_attentions — retain_grad on a returned map, then
    backward from the output, must give the map a gradient (the maps were built apart from the op, so it was None);
    asking for the maps changes the output by float rounding only (the reference op computes it then)."""
    model = build_model("debug", attention, seed=0, vocab_size=VOCAB)
    ids = _ids()
    out = model(ids, output_attentions=True)
    maps = out.attentions[0]
    maps.retain_grad()
    out.logits.flatten()[0].backward()
    assert maps.grad is not None and maps.grad.abs().sum() > 0
    with torch.no_grad():
        plain = model(ids).logits
    eps = torch.finfo(plain.dtype).eps
    torch.testing.assert_close(out.logits.detach(), plain, rtol=64 * eps, atol=64 * eps * plain.abs().max().item())


@pytest.mark.parametrize("attention", ["diff", "diff-v2"])
def test_output_attentions_in_the_config_returns_the_maps_the_keyword_returns(attention):
    model = build_model("debug", attention, seed=0, vocab_size=VOCAB).eval()
    model.set_attn_implementation("eager")  # transformers refuses config.output_attentions under sdpa
    ids = _ids()
    with torch.no_grad():
        by_keyword = model(ids, output_attentions=True).attentions
        model.config.output_attentions = True
        by_config = model(ids).attentions
        overridden = model(ids, output_attentions=False).attentions  # the keyword wins, as in transformers
    assert len(by_keyword) == model.config.num_hidden_layers
    assert len(by_config) == len(by_keyword)
    for c, k in zip(by_config, by_keyword, strict=True):
        assert torch.equal(c, k)
    assert not overridden
