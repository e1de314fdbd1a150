"""Constrained decoding: a request's json_schema / regex / ebnf turned into a token mask at every step, by
xgrammar or llguidance (--grammar-backend; backend_table.py, xgrammar_engine.py, llguidance_engine.py).

    edge (RequestTokenizer)   grammar_check.check_request_grammar: the grammar parses, the backend is on -> else 400
    scheduler.add_request     GrammarQueue.add: compile in the background (GrammarCache, keyed by kind + text);
                              the request waits there, other requests keep running
    each step                 GrammarQueue.pop_ready -> waiting queue (or a 400 abort if the engine refused it)
    decode forward            bitmask_fill.BitmaskFiller.start: a worker thread fills the batch's bitmask rows meanwhile
    sampler                   logits_mask.apply_grammar_mask_: one bitmask row per constrained request (rows the worker
                              has not reached are shared between it and the sampler), applied to the whole batch at
                              once (greedy and sampled alike)
    commit                    RequestGrammar.accept: advance the matcher; a terminated grammar finishes the request
    finish / abort            RequestGrammar.release: the matcher is dropped (GrammarBackend.num_live_matchers)

The bitmask buffer (request slots x ceil(vocab / 32) x 4 B) and the compiled-grammar cache budget are memory-plan
terms (mem_plan/sizes.py: grammar_bitmask_bytes_per_slot); GrammarBackend allocates the buffer once from them.
"""
