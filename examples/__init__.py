"""Example DLRM LightningModule and Criteo-like DataModules, reusable and the CLI defaults."""
