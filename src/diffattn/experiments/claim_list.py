"""Every claim of the four papers, and where this library tests it: a report row, a measurement made elsewhere, or
the reason it cannot here; and every numbered table and figure of the papers that reports a result.

One entry per claim (DIFF Transformer, Ye et al. ICLR 2025; Dex, Kong et al. 2025; DiffLoRA, Misrahi et al. 2025;
DAA 2025 with DiffQ/K/V). Exactly one of:

* ``row``: the ``source`` of the report row that checks it (the rows are made by
  :func:`diffattn.experiments.claims.paper_claims` for DIFF pairs and by each method's registry entry for adapters);
* ``measured_in``: where it is measured outside the report rows (a benchmark, a test), and what was found;
* ``not_testable``: why this scale — quick/small models trained for minutes on a 2-core CPU, 128–1024 positions,
  Shakespeare, SmolLM2-135M the only pretrained model offline — cannot check it. Where a suite measures it but no
  claim row reads the measurement yet, the reason says so.

``refs`` names the paper's tables and figures the claim covers, items of :data:`PAPER_TABLES_AND_FIGURES` (the list
of every numbered table and figure that reports a result; :data:`PAPER_NON_RESULTS` holds the diagrams and
configuration tables, which report none — except DIFF's App. D / E hyperparameter tables, which the shared summary
quotes without their numbers). docs/paper-tables.md is that list, written by :func:`paper_tables_markdown`
(``python -m diffattn.experiments.claim_list > docs/paper-tables.md``). Every report ends with the "not testable
here" and "measured elsewhere" tables of the papers it touches (:func:`not_testable_markdown`); a test walks the list
against the rows the engine makes, both ways, and against the tables and figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

DIFF, DEX, DIFFLORA, DAA = "DIFF Transformer", "Dex", "DiffLoRA", "DAA"
PAPERS = (DIFF, DEX, DIFFLORA, DAA)


class PaperItem(NamedTuple):
    """A numbered table or figure of one of the papers: (paper, "Table N" / "Fig. N", what it shows)."""

    paper: str
    item: str
    shows: str


# Read from the project's shared papers: DIFF Transformer from its summary and excerpt (they mention its
# long-sequence evaluation, §3.3, but not its Fig. 4: that item follows the paper itself), Dex, DiffLoRA and DAA
# from their text. In paper order. Left out: the tables and figures that report no result (PAPER_NON_RESULTS
# below), and the hyperparameter tables of DIFF's App. D / E, which the summary quotes without their numbers.
PAPER_TABLES_AND_FIGURES: tuple[PaperItem, ...] = (
    # DIFF Transformer (diff-transformer-summary.md, diff-transformer-paper-excerpt.md)
    PaperItem(DIFF, "Fig. 1", "attention to the answer vs to the irrelevant context of a retrieval prompt (Transformer "
                              "0.03 vs 0.34), and DIFF's retrieval gain"),
    PaperItem(DIFF, "Fig. 3", "scaling curves: loss against parameters (830M–13.1B) and training tokens; DIFF matches "
                              "the Transformer with ~62% of the parameters, ~64% of the tokens"),
    PaperItem(DIFF, "Fig. 4", "cumulative average NLL over positions up to 64K tokens after long-context training "
                              "(§3.3; the shared summary and excerpt do not describe the figure)"),
    PaperItem(DIFF, "Table 1", "zero-shot LM Eval Harness scores of DIFF-3B (1T tokens) against OpenLLaMA-v2-3B and "
                               "two StableLM 3B models"),
    PaperItem(DIFF, "Table 2", "multi-needle retrieval at 4K tokens, cells N=1,R=1 / N=2,4,6 with R=2: Transformer "
                               "1.00 / 0.85 / 0.62 / 0.35, DIFF 1.00 / 0.92 / 0.84 / 0.85"),
    PaperItem(DIFF, "Table 3", "attention to the answer span and attention noise at five answer depths: Transformer "
                               "0.03–0.09 / 0.49–0.54, DIFF 0.27–0.40 / 0.01–0.02"),
    PaperItem(DIFF, "Fig. 5", "N = 8, R = 1 retrieval over context lengths up to 64K × answer depths: DIFF ~0.85 "
                              "throughout, the Transformer falls (0.12 vs 0.88 at 25% depth, 64K)"),
    PaperItem(DIFF, "Fig. 6", "many-shot ICL accuracy as demonstrations grow to 64K tokens on TREC, TREC-fine, "
                              "Banking-77, Clinic-150: DIFF +5.2 to +21.6 points"),
    PaperItem(DIFF, "Fig. 7", "ICL accuracy over 10 demonstration orders on TREC, random and by-class arrangement: "
                              "best − worst 19.0 vs 4.0 and 56.7 vs 13.4"),
    PaperItem(DIFF, "Table 4", "contextual hallucination, GPT-4o judged, in summaries (XSum, CNN/DM, MultiNews) and QA "
                               "(Qasper, HotpotQA, 2WikiMQA): DIFF 7–19 points more accurate"),
    PaperItem(DIFF, "Table 5", "largest and median activations: top-1 attention logit 318.0 vs 38.8, top-1 hidden "
                               "state 3608.6 vs 1688.2 (Transformer vs DIFF, 3B)"),
    PaperItem(DIFF, "Fig. 8", "HellaSwag zero-shot accuracy with attention logits quantised from 16 to 4 bits: 4-bit "
                              "DIFF ≈ 6-bit Transformer, ~25 points above the 4-bit one"),
    PaperItem(DIFF, "Table 6", "1.4B ablations, validation loss with its AR-Hit / Others split: Transformer, half the "
                               "heads, + GroupNorm, DIFF, DIFF − GroupNorm, λ_init 0.8 / 0.5"),
    PaperItem(DIFF, "Table 7", "throughput against the Transformer on H100s (3B at 2K and 4K, 13B at 2K): 6–12% lower "
                               "forward + backward, 5–10% forward only (App. A)"),
    PaperItem(DIFF, "Table 8", "3B models on 350B tokens, same recipe: zero- and 5-shot scores on 7 LM Eval Harness "
                               "tasks, DIFF +0.8 / +1.6 on average (App. B)"),
    PaperItem(DIFF, "Fig. 9", "average accuracy on 8 math benchmarks during 20B tokens of math training: DIFF 11.3 "
                              "points ahead at the end (App. C)"),
    PaperItem(DIFF, "Fig. 10", "o1-style reasoning after DeepSeek-R1 distillation, 8 math benchmarks: 50.8 vs 43.3 "
                               "average accuracy, shorter reasoning (App. C)"),
    PaperItem(DIFF, "App. F", "Fig. 7's order robustness on TREC-fine, Banking-77, Clinic-150: best − worst 24.0 vs "
                              "9.0, 13.0 vs 9.0, 12.0 vs 6.0 (its number is not in the shared text)"),
    # Dex (dex-differential-extension.md)
    PaperItem(DEX, "Fig. 1", "DIFF's two attention groups compared head by head (rank and Pearson correlation, JS "
                             "divergence, cosine distance): they agree more on non-salient tokens than on the top 5%"),
    PaperItem(DEX, "Fig. 2", "per layer, the sparsity ratio (|a| < ε, ε = 1e-4 and 1e-6) and attention entropy (of "
                             "|a|, and of each group): DIFF less sparse except in the bottom layers, higher entropy"),
    PaperItem(DEX, "Fig. 3", "proportion and mean magnitude of DIFF's positive and negative attention scores per "
                             "layer: the negatives' relative magnitude grows in higher layers"),
    PaperItem(DEX, "Fig. 4", "signed attention on Indirect Object Identification and sarcasm examples, DIFF against "
                             "Llama (qualitative)"),
    PaperItem(DEX, "Fig. 5", "pairwise cosine distance between heads' attention maps and CKA between heads' features: "
                             "DIFF's heads less redundant"),
    PaperItem(DEX, "Fig. 6", "per-layer head importance, normalised and sorted: spread more evenly over DIFF's heads"),
    PaperItem(DEX, "Fig. 7", "Hessian max-eigenvalue spectra: fewer negative eigenvalues for DIFF than for the "
                             "Transformer or DIFF without a learnable λ"),
    PaperItem(DEX, "Fig. 8", "training loss and gradient norm of the Transformer, DIFF and DIFF with a non-learnable λ "
                             "(unstable)"),
    PaperItem(DEX, "Table 1", "11 LM benchmarks after Dex and after LoRA, PiSSA, FT, GaLore, APOLLO on the same corpus "
                              "(Llama-3.2-1B/3B, Llama-3.1-8B, Qwen-2.5-0.5B/1.5B)"),
    PaperItem(DEX, "Table 2", "effective attention to the answer span at five depths: Llama-3B 0.06 → Dex 0.19 on "
                              "average"),
    PaperItem(DEX, "Fig. 10", "multi-needle retrieval N = 8, R = 1 over context lengths and depths: Llama-3B 66.9% → "
                              "with Dex 78.3%"),
    PaperItem(DEX, "Table 3", "many-shot ICL on TREC, Banking-77, Clinic-150 from 1 to 2000 shots: Llama, LoRA, FT, "
                              "Dex (Dex best on average)"),
    PaperItem(DEX, "Table 4", "Llama-3B ablation, 11-benchmark average: head selection (all 61.9, importance 63.9, low "
                              "entropy 62.8, high entropy 64.2) and λ learned / annealed"),
    PaperItem(DEX, "Fig. 11", "(a) cos(O, Δ) against ‖Δ‖/‖O‖ per head; (b) head CKA, lower after Dex; (c) λ during "
                              "training: zero init, no annealing, Dex's schedule"),
    PaperItem(DEX, "Fig. 12", "inference throughput of Llama, DIFF and Dex (3B, one A100, 1K–64K tokens): Dex close to "
                              "Llama, DIFF slower as the context grows (§4.4; set-up in App. E)"),
    PaperItem(DEX, "Fig. 13", "Dex's benchmark gain against the amount of training data: notable from 400M tokens"),
    PaperItem(DEX, "Fig. 14", "rank and Pearson correlation between Llama's and DIFF's attention per layer: higher on "
                              "absolute values than on signed ones (App. B.1)"),
    PaperItem(DEX, "Fig. 15", "mean pairwise cosine distance between heads' maps per layer, Llama, LLAMA-half (half "
                              "the heads, twice as wide) and DIFF (App. B.2)"),
    PaperItem(DEX, "Fig. 16", "per-layer heatmaps of the cosine distance between heads' maps, Llama vs DIFF "
                              "(App. B.2)"),
    PaperItem(DEX, "Fig. 17", "head CKA heatmaps, Llama vs Dex (App. B.2)"),
    PaperItem(DEX, "Table 5", "Dex's λ_init on Qwen-0.5B, 11-benchmark average: 0.8 / 0.5 / 0.3 / DIFF's schedule → "
                              "54.3 / 54.0 / 54.2 / 54.4 (App. B.3)"),
    PaperItem(DEX, "Table 6", "heads per layer k on Llama-1B: 8 / 16 / 24 / 32 → 53.7 / 55.6 / 54.4 / 54.1 (App. B.4)"),
    PaperItem(DEX, "Fig. 18", "more IOI and sarcasm examples of DIFF's negative attention (App. B.5, qualitative)"),
    PaperItem(DEX, "Table 7", "instruction tuning, Llama-8B: MMLU, ARC-C, IFEval, MBPP++, GSM8K, AGIEval for LoRA, FT "
                              "and Dex (App. C)"),
    PaperItem(DEX, "Table 8", "small scale, 11 benchmarks: Llama and DIFF trained from scratch, Dex (that Llama "
                              "adapted on <1B tokens of its pretraining data), Dex-S (Dex attached from scratch): "
                              "averages 42.4 / 42.9 / 42.8 / 42.8 (App. D)"),
    PaperItem(DEX, "Fig. 19", "head CKA of Llama, Dex and DIFF: Dex's and DIFF's heads less aligned than Llama's "
                              "(App. D)"),
    # DiffLoRA (difflora.md)
    PaperItem(DIFFLORA, "Fig. 1", "TruthfulQA, PopQA, ARC-C, DROP, BBH, GSM8k, HumanEval before and after fine-tuning: "
                                  "base, LoRA, DiffLoRA variants (+11 HumanEval, −7 DROP; the GroupNorm variant the "
                                  "exception)"),
    PaperItem(DIFFLORA, "Fig. 2", "many-shot ICL (TREC, TREC-fine, Banking77, Clinic150): DiffLoRA ≈ the initial "
                                  "model, below LoRA"),
    PaperItem(DIFFLORA, "Fig. 3", "needle in a haystack, multi-key (MK) and multi-value (MV): LoRA above every "
                                  "DiffLoRA at MK = 2, every DiffLoRA above LoRA at MV, the initial model above all"),
    PaperItem(DIFFLORA, "Table 1", "RAG QA, top-5 retrieved documents, LLM judge (BioASQ, PopQA, TechQA): DiffLoRA "
                                   "below LoRA, λ = 0.1 above learned λ, + GN collapses"),
    PaperItem(DIFFLORA, "Fig. 4", "attention mass by part of the sequence (BOS, around the magic number, …) for the "
                                  "base, LoRA and DiffLoRA, main and denoiser components"),
    PaperItem(DIFFLORA, "Fig. 5", "attention mass by where the adapters sit (both terms or the right one) and λ fixed "
                                  "or learned (App. B)"),
    PaperItem(DIFFLORA, "Table 3", "the full RAG table: BioASQ, FiQA, KILT-NQ, PopQA, TechQA (App. D)"),
    # DAA (daa-differential-attention-adaption.md)
    PaperItem(DAA, "Fig. 1", "attention on an ARC-E prompt, DAA against DEX (qualitative)"),
    PaperItem(DAA, "Table 1", "per architecture: reduces attention noise (DIFF, DiffK, DiffQ, DAA yes; DEX, DiffV no), "
                              "fits a pretrained model, parameters per attention layer"),
    PaperItem(DAA, "Table 2", "GPT-2 fine-tuned on OpenWebText: perplexity (OWT, OWT(new), WikiText-2, LAMBADA), "
                              "LAMBADA accuracy, needle retrieval; base, FT, DEX, DiffQ, DiffK, DiffV, DAA"),
    PaperItem(DAA, "Fig. 3", "training loss of the fine-tuned GPT-2 variants: DiffK and DiffQ lowest, DAA below DEX, "
                             "standard attention highest"),
    PaperItem(DAA, "Table 3", "Llama-3.2-1B and 3.1-8B after multi-task fine-tuning, 8 benchmarks: FT, DEX, DiffQ, "
                              "DiffK, DiffV, DAA (DAA +1.06 / +0.74 on average)"),
    PaperItem(DAA, "Fig. 4", "one GPT-2 case: standard vs DAA attention with their entropy (DAA sharper), and DAA's A1 "
                             "and A2 (A2 holds the background noise)"),
    PaperItem(DAA, "Table 4", "FLOPs per attention layer, linear and quadratic terms, of standard, DEX, DiffQ/K, DiffV "
                              "and DAA (App. C)"),
    PaperItem(DAA, "Table 5", "DAA's λ_init on Llama-3.2-1B: 0.8 / 0.5 / 0.2 → 53.3 / 53.25 / 53.37 (App. E.3)"),
)  # fmt: skip

# Numbered tables and figures that report no result: diagrams, pseudocode, configurations.
PAPER_NON_RESULTS: tuple[PaperItem, ...] = (
    PaperItem(DIFF, "Fig. 2", "diagram of multi-head differential attention and its pseudocode"),
    PaperItem(DEX, "Fig. 9", "diagram of Dex and its pseudocode"),
    PaperItem(DEX, "Table 9", "configuration of the 0.4B DIFF Transformer trained for the analyses (App. F.2)"),
    PaperItem(DIFFLORA, "Table 2", "training hyperparameters (App. B)"),
    PaperItem(DAA, "Fig. 2", "diagram of where DEX, DAA and DiffQ/K/V put the differential operation"),
)  # fmt: skip


@dataclass(frozen=True)
class ClaimEntry:
    paper: str
    claim: str
    row: str | None = None  # the source of the report row that checks it
    not_testable: str | None = None  # why not at this scale
    measured_in: str | None = None  # where it is measured outside the report rows, and what was found
    refs: tuple[str, ...] = ()  # the paper's tables and figures it covers ("Table 2", "Fig. 5"): PaperItem.item

    def __post_init__(self):
        if sum(x is not None for x in (self.row, self.not_testable, self.measured_in)) != 1:
            raise ValueError(
                f"{self.claim!r}: a claim is either a report row or not testable, with a reason, or measured "
                "elsewhere (exactly one of row, not_testable, measured_in)"
            )
        if not isinstance(self.refs, tuple) or not all(isinstance(r, str) for r in self.refs):
            raise TypeError(f"{self.claim!r}: refs is a tuple of the paper's tables and figures; got {self.refs!r}")


PAPER_CLAIM_LIST: tuple[ClaimEntry, ...] = (
    # DIFF Transformer
    ClaimEntry(
        DIFF, "lower language-modelling loss than a same-size Transformer",
        row="DIFF Transformer Fig. 3", refs=("Fig. 3", "Table 6"),
    ),
    ClaimEntry(
        DIFF, "better multi-needle retrieval (Table 2's cells N = 2, 4, 6, R = 2)",
        row="DIFF Transformer Table 2", refs=("Table 2", "Fig. 1"),
    ),
    ClaimEntry(
        DIFF, "better retrieval of one needle among N (R = 1 cells across N; ours)",
        row="DIFF Transformer Table 2 (ours: R = 1 across N)", refs=("Table 2",),
    ),
    ClaimEntry(
        DIFF, "the retrieval gap grows with the number of needles N",
        row="DIFF Transformer Table 2", refs=("Table 2",),
    ),
    ClaimEntry(
        DIFF, "better retrieval in the paper's own cell N = 6, R = 2",
        row="DIFF Transformer Table 2", refs=("Table 2",),
    ),
    ClaimEntry(
        DIFF, "better retrieval across context lengths and depths",
        row="DIFF Transformer Fig. 5", refs=("Fig. 5",),
    ),
    ClaimEntry(
        DIFF, "more attention to the answer, less attention noise",
        row="DIFF Transformer Table 3", refs=("Table 3", "Fig. 1"),
    ),
    ClaimEntry(
        DIFF, "better many-shot in-context learning",
        row="DIFF Transformer Fig. 6", refs=("Fig. 6",),
    ),
    ClaimEntry(
        DIFF, "more robust to the order of demonstrations",
        row="DIFF Transformer Fig. 7", refs=("Fig. 7", "App. F"),
    ),
    ClaimEntry(
        DIFF, "smaller attention-logit and hidden-state outliers",
        row="DIFF Transformer Table 5", refs=("Table 5",),
    ),
    ClaimEntry(
        DIFF, "degrades less when attention logits go to low bits",
        row="DIFF Transformer Fig. 8", refs=("Fig. 8",),
    ),
    ClaimEntry(
        DIFF, "lower loss on associative-recall (AR-Hit) tokens, also against the Transformer with half the heads",
        row="DIFF Transformer Table 6", refs=("Table 6",),
    ),
    ClaimEntry(
        DIFF, "associative recall as a task (Zoology MQAR; ours, from Table 6's AR-Hit): accuracy at the most pairs, "
        "and how fast it falls as the pairs grow",
        row="MQAR (ours, from DIFF Table 6's AR-Hit)", refs=("Table 6",),
    ),
    # Table 6's halved-heads control: the engine makes every CLAIM_TABLE row against every same-preset standard
    # model (claims._pairs), so a Transformer with half the heads in an experiment gets loss (and AR-Hit, MQAR) rows
    # of its own (configs/mqar-seeds.yaml has one, trained on MQAR rather than text)
    ClaimEntry(
        DIFF, "the gain is not the fewer, wider heads: DIFF's loss is below the Transformer's with half the heads too "
        "(Table 6: 3.062 vs 3.088)",
        row="DIFF Transformer Fig. 3", refs=("Table 6",),
    ),
    ClaimEntry(
        DIFF, "matches a Transformer with ~62–65% of the parameters or tokens (scaling curves, Fig. 3)",
        not_testable="needs a series of model sizes and token budgets; one size per experiment here", refs=("Fig. 3",),
    ),
    ClaimEntry(
        DIFF, "better zero-shot scores on LM Eval Harness tasks (Table 1; zero- and 5-shot against a same-recipe "
        "Transformer, Table 8)",
        not_testable="models of ~0.7M parameters score at chance on those tasks (the lm-eval bridge runs them)",
        refs=("Table 1", "Table 8"),
    ),
    ClaimEntry(
        DIFF, "better use of 64K-token contexts (Fig. 4, long-sequence NLL)",
        not_testable="the models have 128–1024 positions", refs=("Fig. 4",),
    ),
    ClaimEntry(
        DIFF, "fewer hallucinations in summarisation and QA (Table 4)",
        not_testable="needs judged summaries and answers from a model that can write them", refs=("Table 4",),
    ),
    ClaimEntry(
        DIFF, "GroupNorm matters for DIFF (without it 3.062 → 3.122) and the λ initialisation does not (exponential vs "
        "constant 0.8 / 0.5: within 0.004) (ablations, Table 6)",
        not_testable=(
            "the λ-initialisation differences (≤ 0.004 in loss at 1.4B) are far below what seeds resolve here (DIFF V1 "
            "seed SD 0.039 in results/seeds-loss: ~1,500 seeds per arm for 80% power); the GroupNorm effect (+0.060) "
            "needs ~7 seeds per arm (~2.5 h of this CPU) and is not run yet (the options norm and lambda_init exist)"
        ),
        refs=("Table 6",),
    ),
    ClaimEntry(
        DIFF, "GroupNorm does nothing for the Transformer (Table 6: 3.088 → 3.086, with half the heads)",
        not_testable=(
            "no Transformer with GroupNorm is built here (the norm option, rms / rms_affine / none, is the DIFF "
            "architecture's only); and 0.002 is far below the Transformer's seed SD of 0.011 in results/seeds-loss "
            "(~475 seeds per arm for 80% power)"
        ),
        refs=("Table 6",),
    ),
    ClaimEntry(
        DIFF, "costs only 6–12% of training throughput (5–10% forward only) with the paper's kernel (Table 7)",
        measured_in=(
            "benchmarks/gpu-runs/h100-2026-11-26/README.md: on one H100, bf16, batch 4, the `small` preset's train "
            "step takes 1.40× the baseline's time at 1,024 tokens and 1.28× at 4,096 (HF DiffLlama 1.31× / 1.28×), "
            "i.e. 28–40% more time, not 6–12%; the attention op alone, per route, in the README's route table. A "
            "throughput measurement, not a report row"
        ),
        refs=("Table 7",),
    ),
    ClaimEntry(
        DIFF, "better math: accuracy during math training and after o1-style R1 distillation (Fig. 9–10)",
        not_testable=(
            "needs 3B models trained on 20B math tokens and DeepSeek-R1 reasoning traces, scored on 8 math benchmarks "
            "(GSM8K, MATH, …): neither the data nor the benchmarks are offline, and models of ~0.7M parameters trained "
            "on Shakespeare do not solve word problems"
        ),
        refs=("Fig. 9", "Fig. 10"),
    ),
    # Dex
    ClaimEntry(
        DEX, "Dex raises the (effective) attention to the answer",
        row="Dex Table 2", refs=("Table 2",),
    ),
    ClaimEntry(
        DEX, "Dex improves multi-needle retrieval",
        row="Dex §4.2, Fig. 10", refs=("Fig. 10",),
    ),
    ClaimEntry(
        DEX, "Dex improves retrieval of one needle among several at one length (ours: the R = 1 cells across N)",
        row="Dex §4.2 (ours: R = 1 cells across N)", refs=("Fig. 10",),
    ),
    ClaimEntry(
        DEX, "Dex lowers inter-head redundancy (linear CKA)",
        row="Dex Fig. 11b", refs=("Fig. 11", "Fig. 17", "Fig. 19"),
    ),
    ClaimEntry(
        DEX, "the gain is Dex's λ term, not its projection (ours: against λ = 0)",
        row="Dex Table 2 (vs λ = 0)", refs=("Table 2",),
    ),
    ClaimEntry(
        DEX, "the retrieval gain is Dex's λ term, not its fine-tuned W_K, W_V, W_O (ours: against its own λ = 0)",
        row="Dex §4.2 (vs λ = 0)", refs=("Fig. 10",),
    ),
    ClaimEntry(
        DEX, "the attention gain is more than an attention fine-tune's (ours)",
        row="Dex Table 2 (vs attn-ft)", refs=("Table 2",),
    ),
    ClaimEntry(
        DEX, "the retrieval gain is more than an attention fine-tune's (ours)",
        row="Dex §4.2 (vs attn-ft)", refs=("Fig. 10",),
    ),
    ClaimEntry(
        DEX, "Fig. 10's multi-needle gain is more than an attention fine-tune's (ours: the same heatmap)",
        row="Dex §4.2, Fig. 10 (vs attn-ft)", refs=("Fig. 10",),
    ),
    ClaimEntry(
        DEX, "Dex keeps or improves benchmark accuracy (Table 1) and many-shot ICL (Table 3)",
        not_testable="SmolLM2-135M after 40 steps is near chance on the offline ICL sets; no benchmark data offline",
        refs=("Table 1", "Table 3"),
    ),
    # Dex §2's analyses of DIFF Transformer (the paper's own 0.4B DIFF model against a Transformer)
    ClaimEntry(
        DEX, "DIFF's two maps agree more on non-salient tokens than on the top 5% (Fig. 1)",
        not_testable=(
            "the capture records both maps of a DIFF model (attn1, attn2: diffattn.eval.capture), but no suite "
            "compares them (correlation, JS divergence, cosine distance by token salience): no measurement, no row"
        ),
        refs=("Fig. 1",),
    ),
    ClaimEntry(
        DEX, "DIFF attention is not sparser: a lower sparsity ratio than softmax attention except in the bottom "
        "layers, and a higher entropy (Fig. 2)",
        not_testable=(
            "measured by the heads suite per layer (entropy of |a| renormalised; sparsity ratio at the paper's "
            "ε = 1e-6 and 1e-4, and at 1e-3 and 1e-2; no entropy per group), but no claim row reads it yet: the "
            "suite's claim measures are heads:cka and heads:cosine_distance"
        ),
        refs=("Fig. 2",),
    ),
    ClaimEntry(
        DEX, "DIFF gives a substantial share of negative attention, its magnitude growing in higher layers (Fig. 3; "
        "Fig. 4 and 18 show examples)",
        not_testable=(
            "measured by the heads suite per layer (negative_share, negative_magnitude of the signed map) and the "
            "alloc suite (negative_mass of the answering row); no claim row reads them yet. The examples (IOI, "
            "sarcasm) need a model that resolves them; a 0.7M-parameter Shakespeare model does not"
        ),
        refs=("Fig. 3", "Fig. 4", "Fig. 18"),
    ),
    ClaimEntry(
        DEX, "DIFF's heads are less redundant than a Transformer's, also than one with half the heads, twice as wide "
        "(cosine distance between maps, CKA between features; Fig. 5, 15, 16, 19)",
        not_testable=(
            "measured by the heads suite (heads:cosine_distance and heads:cka are claim measures, per-layer distance "
            "matrices drawn as heatmaps; the halved-heads Transformer is a model override, configs/mqar-seeds.yaml), "
            "but no claim row reads them for DIFF against a Transformer yet: CLAIM_TABLE has none (only Dex's entry "
            "reads heads:cka, for adapters)"
        ),
        refs=("Fig. 5", "Fig. 15", "Fig. 16", "Fig. 19"),
    ),
    ClaimEntry(
        DEX, "head importance is spread more evenly over DIFF's heads (Fig. 6)",
        not_testable=(
            "head importance (Michel et al.) is computed only to choose Dex's heads on pretrained models "
            "(adapters.dex.head_importance); no suite reports its distribution per layer, for DIFF or a Transformer"
        ),
        refs=("Fig. 6",),
    ),
    ClaimEntry(
        DEX, "fewer negative Hessian eigenvalues for DIFF than for a Transformer or DIFF without a learnable λ "
        "(Fig. 7)",
        not_testable=(
            "the library computes no Hessian spectrum, and builds no DIFF with a fixed λ (its DIFF options: backend, "
            "lambda_init, norm)"
        ),
        refs=("Fig. 7",),
    ),
    ClaimEntry(
        DEX, "DIFF trains to lower loss with steadier gradient norms, and loses that without a learnable λ (Fig. 8)",
        not_testable=(
            "every run logs loss and gradient norm per logging step (metrics.jsonl; the report's loss_curves.png), but "
            "no claim row reads training curves or gradient norms (validation loss is the 'DIFF Transformer Fig. 3' "
            "row), and no DIFF with a fixed λ is built"
        ),
        refs=("Fig. 8",),
    ),
    ClaimEntry(
        DEX, "DIFF's attention magnitudes correlate with a Transformer's more than its signed scores do (Fig. 14)",
        not_testable=(
            "no suite compares two models' maps position by position (the capture records each model's maps; nothing "
            "correlates them)"
        ),
        refs=("Fig. 14",),
    ),
    # Dex itself
    ClaimEntry(
        DEX, "high-entropy head selection with λ both learned and annealed is best; selecting heads beats adapting all "
        "(Table 4)",
        not_testable=(
            "the variants are options (DexConfig heads: entropy, importance, low-entropy, all, random; anneal; "
            "lambda_init), but the paper's measure is the 11-benchmark average, with no benchmark data offline, and no "
            "row compares the variants"
        ),
        refs=("Table 4",),
    ),
    ClaimEntry(
        DEX, "Dex's Δ = λ·f_D(O) both amplifies and attenuates, head by head (cos(O, Δ) against ‖Δ‖/‖O‖, Fig. 11a)",
        not_testable="no suite computes cos(O, Δ) or ‖Δ‖/‖O‖ of Dex's heads", refs=("Fig. 11",),
    ),
    ClaimEntry(
        DEX, "λ must be annealed: a zero-initialised learnable λ fails to introduce Dex, no annealing is unstable "
        "early (Fig. 11c)",
        not_testable=(
            "λ per layer is logged at every logging step (metrics.jsonl; the report's lambda_curves.png) and anneal: "
            "false is an option; results/adapters-lambda shows how far λ moves in 40 steps; no claim row reads λ "
            "trajectories"
        ),
        refs=("Fig. 11",),
    ),
    ClaimEntry(
        DEX, "Dex keeps the base model's throughput; DIFF falls behind as the context grows (Fig. 12)",
        measured_in=(
            "benchmarks/RESULTS.md, adapters.py (2-core CPU, 512 tokens): Dex unmerged 1.03× the base's forward time "
            "(tiny Llama) and ≈1.01× (SmolLM2-135M, 9-rep rerun), merged the base graph itself; DIFF against its "
            "baseline on an H100 in benchmarks/gpu-runs/h100-2026-11-26/README.md. Not the paper's 1K–64K sweep"
        ),
        refs=("Fig. 12",),
    ),
    ClaimEntry(
        DEX, "Dex's gain appears from ~400M training tokens (Fig. 13)",
        not_testable=(
            "adapter runs here train 40 steps of 4 × 256 tokens (41k tokens), and the measure is the 11-benchmark "
            "average, with no benchmark data offline"
        ),
        refs=("Fig. 13",),
    ),
    ClaimEntry(
        DEX, "Dex is robust to λ_init, DIFF's schedule slightly best, and k = half the heads is best (Tables 5–6)",
        not_testable=(
            "the options exist (lambda_init, k), but the measure is the 11-benchmark average, with no benchmark data "
            "offline; the λ_init spread (0.4 points) is below anything a comparison here resolves"
        ),
        refs=("Table 5", "Table 6"),
    ),
    ClaimEntry(
        DEX, "Dex helps instruction tuning (Llama-8B; IFEval, GSM8K, …, Table 7)",
        not_testable="Llama-3.1-8B, its OpenHermes data and the six benchmarks are not offline", refs=("Table 7",),
    ),
    ClaimEntry(
        DEX, "at small scale, DIFF from scratch, Dex (the Llama adapted on <1B tokens) and Dex-S (Dex from scratch) "
        "average above Llama over 11 benchmarks, not on each (Table 8)",
        not_testable=(
            "no benchmark data offline (and the paper's own small models sit near chance on several: ARC-C 21.8–24.2)"
        ),
        refs=("Table 8",),
    ),
    # DiffLoRA
    ClaimEntry(
        DIFFLORA, "DiffLoRA falls short of LoRA at matched parameters in most tasks",
        row="DiffLoRA §4", refs=("Fig. 1", "Fig. 2", "Table 1"),
    ),
    ClaimEntry(
        DIFFLORA, "DiffLoRA gains over LoRA on multi-value needle retrieval",
        row="DiffLoRA Fig. 3 (MV)", refs=("Fig. 3",),
    ),
    ClaimEntry(
        DIFFLORA, "general capabilities stay near the base's (+11 HumanEval, −7 DROP), except with GroupNorm (Fig. 1)",
        not_testable=(
            "TruthfulQA, PopQA, ARC-C, DROP, BBH, GSM8k and HumanEval are not offline, nor Llama-3.2-1B-Instruct and "
            "Tulu-2"
        ),
        refs=("Fig. 1",),
    ),
    ClaimEntry(
        DIFFLORA, "many-shot ICL: DiffLoRA near the base, below LoRA, worse with more demonstrations on TREC-fine and "
        "Banking77 (Fig. 2)",
        not_testable=(
            "the icl suite measures it for any adapter on its offline sets (wordnet, fortunes, chatterbot; not TREC, "
            "Banking77, Clinic150), but SmolLM2-135M after 40 steps is at chance there (results/mini-adapters), and no "
            "claim row reads icl for DiffLoRA against LoRA"
        ),
        refs=("Fig. 2",),
    ),
    ClaimEntry(
        DIFFLORA, "LoRA finds the key asked among several better than DiffLoRA (Fig. 3, MK = 2, as §4 reads it; §5's "
        "discussion says the opposite, 'multiple-key retrieval'), and the untouched model beats every fine-tuned one",
        not_testable=(
            "measured, no row reads it yet: the niah suite's R = 1 cells with N >= 2 (one queried key among N needles "
            "with keys of their own; niah:r1) are the nearest to HELMET's MK task, whose haystack and keys differ "
            "(App. C: UUIDs); configs/adapters-lambda.yaml evaluates the base, DiffLoRA and LoRA on them, but "
            "DiffLoRA's registry entry reads niah only for its MV cell"
        ),
        refs=("Fig. 3",),
    ),
    ClaimEntry(
        DIFFLORA, "DiffLoRA answers retrieval-augmented questions worse than LoRA (Tables 1 and 3)",
        not_testable=(
            "needs a retriever over Wikipedia, the QA sets (BioASQ, FiQA, KILT-NQ, PopQA, TechQA) and an LLM judge, "
            "none offline"
        ),
        refs=("Table 1", "Table 3"),
    ),
    ClaimEntry(
        DIFFLORA, "DiffLoRA moves attention mass only slightly (less on BOS, denoised around the magic number), much "
        "like LoRA (Fig. 4–5)",
        not_testable=(
            "the alloc suite measures the combined signed map's shares per bucket (bos, answer, noise, query) and its "
            "negative mass for DiffLoRA like any two-map adapter, not each component apart; no claim row reads them "
            "for DiffLoRA yet"
        ),
        refs=("Fig. 4", "Fig. 5"),
    ),
    ClaimEntry(
        DIFFLORA, "λ fixed at 0.1 is more stable than a learned λ (§3.4; Table 1: DiffLoRA-64 with λ = 0.1 above the "
        "learned λ on all three sets)",
        not_testable=(
            "both are options (DiffLoRAConfig learn_lambda; the default, λ fixed at 0.1, is what the experiments here "
            "train) and every suite measures either, but no experiment trains the learned-λ variant beside it and no "
            "claim row compares them; the paper's measure, RAG QA, is not offline"
        ),
        refs=("Table 1",),
    ),
    ClaimEntry(
        DIFFLORA, "GroupNorm breaks DiffLoRA on a pretrained model (Fig. 1; RAG 0.025–0.097, Tables 1 and 3)",
        not_testable=(
            "the variant is an option (DiffLoRAConfig group_norm) that every suite can measure, but no experiment here "
            "trains it and no claim row compares it with DiffLoRA without GroupNorm"
        ),
        refs=("Fig. 1", "Table 1", "Table 3"),
    ),
    # DAA, with DiffQ, DiffK, DiffV (the same paper)
    ClaimEntry(
        DAA, "DAA retrieves needles better than fine-tuning the same attention",
        row="DAA Table 2", refs=("Table 2",),
    ),
    ClaimEntry(
        DAA, "DAA beats fine-tuning on the 8-benchmark average after multi-task fine-tuning, not on each (Table 3)",
        not_testable=(
            "no benchmark data offline (ARC-E/C, BoolQ, HellaSwag, OpenBookQA, WIC, WinoGrande, WSC), and "
            "Llama-3.2-1B / 3.1-8B"
        ),
        refs=("Table 3",),
    ),
    ClaimEntry(
        DAA, "DAA's extra cost per attention layer: a second attention map (quadratic term 2 → 3·N²·d) and N·d²/h of "
        "linear work (FLOPs, Table 4)",
        measured_in=(
            "benchmarks/RESULTS.md, adapters.py (2-core CPU, 512 tokens, with the FLOP-ideal ratio of "
            "diffattn.bench.adapters.forward_flops): DAA's forward 1.09–1.12× the base's (ideal 1.04–1.06×); on a GPU "
            "the two-map op's routes are in the README's route table"
        ),
        refs=("Table 4",),
    ),
    ClaimEntry(
        DAA, "DAA pays attention more sharply (lower entropy) with less noise than fine-tuned standard attention, its "
        "second map holding the background noise (Fig. 4)",
        not_testable=(
            "measured, no row reads it yet: the alloc suite (attention to answer, attention noise, negative mass) and "
            "the heads suite (entropy) run on DAA and attn-ft in configs/mini-adapters.yaml; DAA's registry entry "
            "reads only niah:r1_else_n2"
        ),
        refs=("Fig. 4",),
    ),
    ClaimEntry(
        DAA, "DAA attends more to the core scientific associations than Dex on an ARC-E prompt (Fig. 1)",
        not_testable=(
            "a picture of one ARC-E prompt judged by eye, on Llama; no ARC-E offline, and no measure stands for "
            "'focused on the core scientific associations'"
        ),
        refs=("Fig. 1",),
    ),
    ClaimEntry(
        DAA, "DAA adds d²/h parameters per attention layer (one d_k × d_k matrix per head), DiffQ/K/V d² (one "
        "d_model × d_model W_D) (Table 1, App. B)",
        measured_in=(
            "tests/adapters/test_adapters.py (test_trainable_set_is_the_method_s_and_a_few_steps_lower_the_loss): the "
            "trainable set of DAA is the attention's plus h·d_k² (+ λ_learn) per layer, of DiffQ/K/V plus d_model² "
            "(+ λ_learn), counted from each method's equations on Llama, Qwen3 and GPT-2"
        ),
        refs=("Table 1",),
    ),
    ClaimEntry(
        DAA, "DAA has the best LAMBADA accuracy (48.9) and LAMBADA perplexity (42.25) among the fine-tuned GPT-2 "
        "variants (Table 2)",
        not_testable=(
            "GPT-2 is not offline (SmolLM2-135M is the one pretrained model) and neither is LAMBADA, OpenWebText or "
            "WikiText-2; the loss measure (per-window NLL on Shakespeare) runs for any adapter, but no row reads it "
            "for DAA against attn-ft"
        ),
        refs=("Table 2",),
    ),
    ClaimEntry(
        DAA, "training loss: DiffK and DiffQ lowest, DAA below Dex, standard attention highest (Fig. 3)",
        not_testable=(
            "every run logs its training loss (metrics.jsonl; the report's loss_curves.png, e.g. "
            "results/mini-adapters), but no claim row reads training curves"
        ),
        refs=("Fig. 3",),
    ),
    ClaimEntry(
        DAA, "DAA is robust to λ_init (0.8 / 0.5 / 0.2 within 0.12 points, Table 5)",
        not_testable=(
            "the measure is the 8-benchmark average, with no benchmark data offline; a 0.12-point spread is below "
            "anything a comparison here resolves (lambda_init is an option)"
        ),
        refs=("Table 5",),
    ),
    # DiffQ, DiffK, DiffV: registered methods (adapters/daa.py, adapters/input_diff.py) whose registry entries
    # declare no paper claims, so no report row reads any suite for them
    ClaimEntry(
        DAA, "DiffK retrieves needles better than fine-tuning; DiffQ and DiffV do not (Table 2 NR: 88.3, 84.4, 84.4 vs "
        "FT 85.3)",
        not_testable=(
            "the niah suite measures it for any adapter (niah:r1_else_n2 is the measure DAA's Table 2 row reads; "
            "configs/adapters-lambda.yaml has its cells for diffv and attn-ft, configs/mini-adapters.yaml runs niah on "
            "diffq, diffk, diffv with other cells), but no row reads it: DiffQ/K/V's registry entries declare no "
            "paper_claims"
        ),
        refs=("Table 2",),
    ),
    ClaimEntry(
        DAA, "DiffQ and DiffK give the best WikiText-2 perplexity (24.4); DiffV is comparable to fine-tuning (Table 2)",
        not_testable=(
            "GPT-2, WikiText-2, OpenWebText and LAMBADA are not offline; the loss measure (per-window NLL on "
            "Shakespeare) runs for diffq, diffk, diffv, but no row reads it for them"
        ),
        refs=("Table 2",),
    ),
    ClaimEntry(
        DAA, "DiffQ and DiffK reduce attention noise, DiffV (and Dex) do not (Table 1)",
        not_testable=(
            "measured, no row reads it yet: the alloc suite's attention noise runs on diffq, diffk, diffv, dex and the "
            "base in configs/mini-adapters.yaml; only Dex's registry entry reads alloc"
        ),
        refs=("Table 1",),
    ),
    ClaimEntry(
        DAA, "DiffQ, DiffK, DiffV: inconsistent on the 8 benchmarks (DiffQ/K up on 1B by the paper's Δ column — its "
        "1B averages disagree with it —, down on 8B), DiffV the least effective, down on both (Table 3)",
        not_testable=(
            "no benchmark data offline (ARC-E/C, BoolQ, HellaSwag, OpenBookQA, WIC, WinoGrande, WSC), and "
            "Llama-3.2-1B / 3.1-8B"
        ),
        refs=("Table 3",),
    ),
    ClaimEntry(
        DAA, "DiffQ/DiffK cost 5·N·d² + 3·N²·d per attention layer, DiffV 5·N·d² + 2·N²·d (FLOPs, Table 4)",
        measured_in=(
            "benchmarks/RESULTS.md, adapters.py (2-core CPU, 512 tokens, with the FLOP-ideal ratio): forward DiffQ "
            "1.16–1.22× the base's, DiffK 1.11–1.19× (ideal 1.12–1.17×), DiffV unmerged 0.99–1.06× (ideal 1.04–1.07×), "
            "DiffV merged the base graph"
        ),
        refs=("Table 4",),
    ),
    ClaimEntry(
        DAA, "DiffQ and DiffK keep the lowest training loss (Fig. 3)",
        not_testable=(
            "every run logs its training loss (metrics.jsonl; loss_curves.png of results/mini-adapters has diffq, "
            "diffk and diffv), but no claim row reads training curves"
        ),
        refs=("Fig. 3",),
    ),
)  # fmt: skip


def _cell(text: str) -> str:
    """Text for a markdown table cell (a "|" in it, as in |a|, would end the cell)."""
    return text.replace("|", "\\|")


def _table(title: str, entries: list[ClaimEntry], column: str, field: str) -> list[str]:
    if not entries:
        return []
    lines = [f"### {title}", "", f"| paper | claim | {column} |", "|---|---|---|"]
    lines += [f"| {e.paper} | {_cell(e.claim)} | {_cell(getattr(e, field))} |" for e in entries]
    return [*lines, ""]


def measured_elsewhere_markdown(papers: set[str] | None = None) -> list[str]:
    """The "measured elsewhere" table of the given papers (default: all four): claims measured outside the report
    rows (a benchmark, a test), with where and what was found."""
    entries = [e for e in PAPER_CLAIM_LIST if e.measured_in and (papers is None or e.paper in papers)]
    return _table("Measured elsewhere", entries, "where", "measured_in")


def not_testable_markdown(papers: set[str] | None = None) -> list[str]:
    """The "not testable here" table of the given papers (default: all four), then their "measured elsewhere"
    table (:func:`measured_elsewhere_markdown`): every claim of theirs that no report row checks."""
    entries = [e for e in PAPER_CLAIM_LIST if e.not_testable and (papers is None or e.paper in papers)]
    return [*_table("Not testable here", entries, "because", "not_testable"), *measured_elsewhere_markdown(papers)]


def _coverage(entry: ClaimEntry) -> str:
    if entry.row:
        return f"row `{entry.row}`: {_cell(entry.claim)}"
    return f"{'measured elsewhere' if entry.measured_in else 'not testable'}: {_cell(entry.claim)}"


def paper_tables_markdown() -> str:
    """docs/paper-tables.md: every numbered table and figure of the papers, what it shows and the claim entries
    that cover it, then those that report no result."""
    lines = [
        "# The papers' tables and figures",
        "",
        "<!-- written by `python -m diffattn.experiments.claim_list > docs/paper-tables.md`; a test keeps it equal -->",
        "",
        "Every numbered table and figure of the four papers that reports a result, and the entries of the claim list",
        "(`src/diffattn/experiments/claim_list.py`, `PAPER_CLAIM_LIST`) that cover it: a report row (the `source`",
        "the claims engine prints), a measurement made outside the rows, or a claim this scale cannot check (the",
        "reasons are in the list, and at the end of every report that touches the paper). Read from the papers in",
        "the project's shared folder: DIFF Transformer's summary and excerpt, Dex, DiffLoRA, DAA (with DiffQ, DiffK,",
        "DiffV).",
        "",
    ]
    for paper in PAPERS:
        lines += [f"## {paper}", "", "| item | what it shows | covered by |", "|---|---|---|"]
        for it in (i for i in PAPER_TABLES_AND_FIGURES if i.paper == paper):
            covered = [_coverage(e) for e in PAPER_CLAIM_LIST if e.paper == paper and it.item in e.refs]
            lines.append(f"| {it.item} | {_cell(it.shows)} | {'<br>'.join(covered)} |")
        lines.append("")
    lines += ["## Not results", "", "Numbered, but reporting no result:", ""]
    lines += [f"- {it.paper} {it.item}: {it.shows}" for it in PAPER_NON_RESULTS]
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    print(paper_tables_markdown(), end="")
