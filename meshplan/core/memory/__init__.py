"""What each GPU holds for training, per pipeline stage and per term.

- bill.py: the stage bill in one pass (parameters, then state, then activations, then the runtime's reserve);
- stage_params.py: the parameters a rank of a stage holds, sharded by each axis;
- stage_activations.py and activations.py: what a stage keeps for backward, tensor by tensor;
- terms.py: each term's formula and source, as the reports print them.
"""
