"""Request bodies of the REST spec, built on pyiceberg's own types.

pyiceberg's client-side models (``CreateTableRequest``, ``RegisterTableRequest``) require fields
the spec makes optional and that Java omits (``location``, ``write-order``, ``overwrite``), so the
server parses with these lenient twins. Commits use pyiceberg's ``CommitTableRequest`` itself:
its discriminated unions of requirements and updates are what rejects an unknown ``action``.
"""

from __future__ import annotations

from pydantic import Field
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableRequest, TableIdentifier
from pyiceberg.table.sorting import SortOrder
from pyiceberg.typedef import IcebergBaseModel


class CreateNamespaceRequest(IcebergBaseModel):
    namespace: list[str]
    properties: dict[str, str] = Field(default_factory=dict)


class UpdateNamespacePropertiesRequest(IcebergBaseModel):
    removals: list[str] = Field(default_factory=list)
    updates: dict[str, str] = Field(default_factory=dict)


class CreateTableRequest(IcebergBaseModel):
    name: str
    location: str | None = None
    table_schema: Schema = Field(alias="schema")
    partition_spec: PartitionSpec | None = Field(alias="partition-spec", default=None)
    write_order: SortOrder | None = Field(alias="write-order", default=None)
    stage_create: bool = Field(alias="stage-create", default=False)
    properties: dict[str, str] = Field(default_factory=dict)


class RegisterTableRequest(IcebergBaseModel):
    name: str
    metadata_location: str = Field(alias="metadata-location")
    overwrite: bool = False


class RenameTableRequest(IcebergBaseModel):
    source: TableIdentifier
    destination: TableIdentifier


class CommitTransactionRequest(IcebergBaseModel):
    table_changes: list[CommitTableRequest] = Field(alias="table-changes")
