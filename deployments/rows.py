"""Rows read and written in SQL as the ORM reads and writes them, for the statements a worker
makes on every move (`runner`): building each with the ORM took longer than running it.

Values go through the same field methods the ORM calls — `get_db_prep_save` on the way in
(encryption, JSON), each field's converters and `from_db` on the way out — so a model read here
equals one the ORM reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from django.db import connection
from django.db.models import Model

_CONVERTERS: dict[tuple[type[Model], str], list] = {}

# Put in a statement's RETURNING (or anywhere it is evaluated once something was written), this
# lets the transaction it is part of commit without waiting for the disk (PostgreSQL's
# `synchronous_commit`, for that transaction alone): for a write that a crash of PostgreSQL may
# lose, together with the other commits of its last moments, because what follows it can be
# done again from the state before it. A later commit that waits for the disk takes every
# earlier one there with it.
UNFLUSHED = "set_config('synchronous_commit', 'off', true)"


@cache  # a model's columns never change: worked out once, not on every move
def columns(model: type[Model], alias: str) -> str:
    """The model's concrete columns, in order, as `alias.column, …`."""
    return ", ".join(
        f"{alias}.{connection.ops.quote_name(f.column)}" for f in model._meta.concrete_fields
    )


def built(model: type[Model], alias: str, values) -> Model:
    """A `model` instance from the `values` of its `columns(model, alias)`, as the ORM builds
    one: each value through its field's converters (JSON decoded, encrypted fields
    decrypted), then `from_db`."""
    if (model, alias) not in _CONVERTERS:
        cols = [f.get_col(alias) for f in model._meta.concrete_fields]
        _CONVERTERS[model, alias] = [
            (col, connection.ops.get_db_converters(col) + col.get_db_converters(connection))
            for col in cols
        ]
    values = list(values)
    for n, (col, functions) in enumerate(_CONVERTERS[model, alias]):
        for convert in functions:
            values[n] = convert(values[n], col, connection)
    names = [f.attname for f in model._meta.concrete_fields]
    return model.from_db(connection.alias, names, values)


@cache
def column(model: type[Model], name: str) -> str:
    """The column of the model's field `name`, quoted."""
    return connection.ops.quote_name(model._meta.get_field(name).column)


def sets(model: type[Model], names: list[str]) -> str:
    """An UPDATE's `SET` of the model's fields `names`: `column = %s, …`."""
    return ", ".join(f"{column(model, name)} = %s" for name in names)


def prepared(model: type[Model], names: list[str], values: dict) -> list:
    """`values` of the model's fields `names`, as their columns store them (encrypted, JSON)."""
    return [
        model._meta.get_field(name).get_db_prep_save(values[name], connection) for name in names
    ]


def insert(*objs: Model) -> None:
    """Insert `objs` as `obj.save(force_insert=True)` would each (their defaults applied by
    their constructors; no signals: none of ours listen), in one statement, their generated
    keys set from the rows. A row may name one inserted beside it: foreign keys are checked
    at commit."""
    writes(objs).run()


@dataclass
class Writes:
    """Rows to insert and one to update (`writes`), and more rows to update (`also_update`):
    the steps of one statement, each an INSERT or an UPDATE returning its row's key, run alone
    (`run`) or in a caller's own statement, which then hands back what they returned
    (`stored`)."""

    steps: list[str]
    params: list
    new: Sequence[Model]
    returned: list[int]  # which of `new` take their key from the database

    def run(self) -> None:
        if len(self.steps) == 1:
            statement = self.steps[0]
        else:  # each write a step of one statement; what they return read side by side
            named = ", ".join(f"r{n} AS ({step})" for n, step in enumerate(self.steps))
            read = ", ".join(f"(SELECT * FROM r{n})" for n in range(len(self.steps)))  # noqa: S608
            statement = f"WITH {named} SELECT {read}"
        with connection.cursor() as cursor:
            cursor.execute(statement, self.params)
            self.stored(cursor.fetchone())

    def also_update(self, model: type[Model], values: dict, **where) -> None:
        """One more step: set the fields `values` of the row of `model` whose fields `where`
        name (a unique key: it returns that row's key, None when there is none), as
        `model.objects.filter(**where).update(**values)` would."""
        fields = {model._meta.get_field(name).attname: value for name, value in values.items()}
        names = list(fields)
        key = column(model, model._meta.pk.attname)
        match = " AND ".join(f"{column(model, name)} = %s" for name in where)
        self.steps.append(
            f"UPDATE {model._meta.db_table} SET {sets(model, names)}"  # noqa: S608 - our names
            f" WHERE {match} RETURNING {key}"
        )
        self.params += [*prepared(model, names, fields), *where.values()]

    def stored(self, keys) -> None:
        """Take what the steps returned, in order: the new rows' keys."""
        for n, obj in enumerate(self.new):
            if n in self.returned:
                obj.pk = keys[n]
            obj._state.adding, obj._state.db = False, connection.alias


def writes(new: Sequence[Model], changed: tuple[Model, list[str]] | None = None) -> Writes:
    """Insert the rows `new` (as `insert`) and write the fields of one row that exists
    (`changed`: the object and its field names, as `obj.save(update_fields=names)` would): the
    steps of one statement, to run (`Writes.run`)."""
    steps, params, returned = [], [], []
    for n, obj in enumerate(new):
        model = type(obj)
        pk = model._meta.pk
        fields = [f for f in model._meta.concrete_fields if not (f is pk and pk.db_returning)]
        names = [f.attname for f in fields]
        values = {f.attname: f.pre_save(obj, add=True) for f in fields}
        steps.append(
            f"INSERT INTO {model._meta.db_table} ({', '.join(column(model, n) for n in names)})"  # noqa: S608 - our names
            f" VALUES ({', '.join(['%s'] * len(names))})"
            f" RETURNING {column(model, pk.attname)}"
        )
        params += prepared(model, names, values)
        if pk.db_returning:
            returned.append(n)
    if changed is not None:
        obj, names = changed
        model = type(obj)
        attnames = [model._meta.get_field(name).attname for name in names]
        key = column(model, model._meta.pk.attname)
        steps.append(
            f"UPDATE {model._meta.db_table} SET {sets(model, attnames)}"  # noqa: S608 - our names
            f" WHERE {key} = %s RETURNING {key}"
        )
        params += [*prepared(model, attnames, {n: getattr(obj, n) for n in attnames}), obj.pk]
    return Writes(steps, params, new, returned)
