"""Evaluation and analysis (docs/evaluation.md): every measurement the four papers made.

Conventions every evaluation follows:

* a **seeded, pure generator** (same seed → same samples on any machine) and a **scorer** that is a plain function
  of model outputs, tested on hand-made outputs;
* a ``run_<name>(model, tokenizer, ..., seed=0) -> dict`` entry point returning JSON-serialisable results with a
  ``"metadata"`` entry that states every choice a paper left open (window/stride, sample counts, templates, …);
* a ``plot_<name>(results, path)`` drawing its picture with matplotlib (Agg backend), returning the path;
* progress bars (tqdm) on anything that loops over samples; clear ``ValueError`` for bad input.

Modules: ``capture`` (attention logits/maps, signed two-map maps, Dex effective attention), ``perplexity``,
``niah`` (multi-needle retrieval), ``allocation`` (attention to answer vs noise), ``mqar`` (associative recall),
``icl`` and ``icl_data`` (many-shot in-context learning, order robustness), ``outliers`` (activation outliers,
low-bit logits), ``heads`` (head redundancy), ``lm_eval_bridge`` (lm-evaluation-harness), ``suite`` (the
``diffattn eval`` command).
"""
