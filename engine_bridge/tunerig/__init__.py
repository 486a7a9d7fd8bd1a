"""From a model and its drives to a tuned profile: the chain `engine-bridge tune-rig` and fleet's
node job both run (docs/tune-rig.md)."""
