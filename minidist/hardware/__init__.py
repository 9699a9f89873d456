"""Inside one accelerator: a systolic array cycle by cycle, a tensor-core tile, the seeds' devices."""
