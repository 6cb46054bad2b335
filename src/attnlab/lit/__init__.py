"""LightningModules (one per task) and their construction from Hydra configs."""
