"""The least-squares refit shared by the stages that repair a cut without training: the
closed-form solves (solve.py) and the full and pruned activation streams they are fitted on
(streams.py). prune's compensation, search's per-candidate refit and score's obs method
(which scores units by how well this refit repairs their removal) use them; a package of its
own so that none of those stages imports another."""
