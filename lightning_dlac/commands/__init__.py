"""The commands: the ``dlac`` console script and its subcommands (the top layer: nothing imports it).

| module | command |
|---|---|
| ``cli`` | ``dlac``: dispatches the subcommands; standard library only, so the light ones start at once |
| ``trainer`` | ``dlac fit|validate|test|predict``: LightningCLI with the example DLRM and ``DLACStrategy`` |
| ``errors`` | the one-line user errors a command ends with (exit status 2) |
| ``estimate`` | ``dlac estimate``: a model of step times on a cluster (a package: ``model``, ``rates``, ``cli``) |
| ``preprocess`` | ``dlac preprocess criteo``: Criteo TSV to TorchRec's binary layout |
| ``report`` | ``dlac report``: rebuild a finished run's report |
"""
