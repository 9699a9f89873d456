"""The instruments beside the textbook: what a step costs on the simulated cluster, never what it computes.

    compute    the compute stream: one step-runner attachment charges every unit's FLOPs (backward 2×)
    memory     the bytes a rank holds, by category, over time (one ledger), and its runner attachment
    collective_rounds   each collective's cost, described once: who sends which chunk to whom, round by round
    collective_cost     those rounds priced on the α-β clock (one exact walker), and the slides' formula
    schedule_figure     a collective's rounds drawn (lesson 05)

The cluster's own clock (minidist/cluster/ledger.py) is what these charge; strategies reach it only
through here. Nothing in this package changes a computed value.
"""
