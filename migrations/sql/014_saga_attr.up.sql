-- millrace 014: correlation keys and search attributes, child sagas (package
-- saga: Spec.Keys, Spec.Attributes, SignalByKey, Step.Child). Not
-- schema-qualified: the migrator sets search_path.

-- saga_attr is one declared key or search attribute of a saga, computed
-- from its data and written with the saga's state whenever the data
-- changes (or the saga ends). kind is key (a correlation key several
-- running sagas may hold), unique_key (at most one running saga of the
-- type holds a value), text, number or time; value holds a key's or a text
-- attribute's value, num a number's, at a time's. live is false once the
-- saga has ended: a key is held by running sagas only. created_at is the
-- saga's, so that a filter lists newest first from the attribute's index.
CREATE TABLE saga_attr (
    saga_id    text             NOT NULL,
    name       text             NOT NULL,
    type       text             NOT NULL,
    kind       text             NOT NULL,
    value      text,
    num        double precision,
    at         timestamptz,
    live       boolean          NOT NULL,
    created_at timestamptz      NOT NULL,
    PRIMARY KEY (saga_id, name),
    CONSTRAINT saga_attr_kind_check CHECK (kind IN ('key', 'unique_key', 'text', 'number', 'time'))
);

-- A unique key's value is held by one running saga of its type at a time
-- (StartTx refuses a second with saga.ErrKeyTaken).
CREATE UNIQUE INDEX saga_attr_unique_key_idx ON saga_attr (type, name, value) WHERE kind = 'unique_key' AND live;
-- Equality on a key or a text attribute (SignalByKey's lookup, a filter
-- customer=ada), newest first; ranges on numbers and times.
CREATE INDEX saga_attr_value_idx ON saga_attr (name, value, created_at DESC, saga_id DESC) WHERE value IS NOT NULL;
CREATE INDEX saga_attr_num_idx ON saga_attr (name, num) WHERE num IS NOT NULL;
CREATE INDEX saga_attr_at_idx ON saga_attr (name, at) WHERE at IS NOT NULL;

-- An event delivered by key (SignalByKey) says which key it came by; one
-- that no saga held is stored with saga_id '' and state refused. An event
-- with child set is a child saga's end (or stuck) told to its parent.
ALTER TABLE saga_event
    ADD COLUMN key_type  text NOT NULL DEFAULT '',
    ADD COLUMN key_name  text NOT NULL DEFAULT '',
    ADD COLUMN key_value text NOT NULL DEFAULT '',
    ADD COLUMN child     text NOT NULL DEFAULT '';

-- A child saga's parent (Step.Child), '' for a saga of its own; the
-- children of a saga are found on the partial index.
ALTER TABLE saga_instance ADD COLUMN parent text NOT NULL DEFAULT '';
CREATE INDEX saga_instance_parent_idx ON saga_instance (parent, created_at DESC, id DESC) WHERE parent <> '';
