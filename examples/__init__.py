"""The example DLRM and its DataModules (the ``dlac`` CLI's defaults), as a package to use and extend.

| module | what |
|---|---|
| ``base`` | ``RankShardedDataModule``: the public base a data source subclasses (docs/data.md) |
| ``synthetic`` | ``SyntheticCriteoDataModule``: Criteo-like data with a planted signal |
| ``tsv`` | ``CriteoTSVDataModule``: small Criteo TSV files, read whole |
| ``binary`` | ``CriteoBinaryDataModule``: full-size Criteo in TorchRec's binary layout |
| ``planted`` | ``PlantedSensitivityDataModule``: tables of known error tolerance |
| ``dlrm`` | ``DLRMModule``: TorchRec's DLRM (dot, DCN v2, projection) as a LightningModule |

The examples import the library (``lightning_dlac.criteo`` for the Criteo format); the library never imports them.
"""
