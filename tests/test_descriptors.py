"""The descriptor classes and the Activation enum (docs/api.md, "Python").

Defaults are MPSGraph's; fields are keyword-only in the constructor, readable and
writable; descriptors compare with ==, have a readable repr, copy and pickle; bad values
are refused when set (ValueError for an activation outside 0..4, TypeError for a value of
the wrong type), naming the field, and leave the descriptor unchanged.
"""

import copy
import pickle
import re

import numpy as np
import pytest

import rnncore

A = rnncore.Activation

# api.md, verbatim: field -> default, in the documented order.
DEFAULTS = {
    "RNNDescriptor": {
        "reverse": False,
        "bidirectional": False,
        "training": False,
        "activation": A.RELU,
    },
    "LSTMDescriptor": {
        "reverse": False,
        "bidirectional": False,
        "produce_cell": False,
        "training": False,
        "forget_gate_last": False,
        "input_gate_activation": A.SIGMOID,
        "forget_gate_activation": A.SIGMOID,
        "cell_gate_activation": A.TANH,
        "output_gate_activation": A.SIGMOID,
        "activation": A.TANH,
    },
    "GRUDescriptor": {
        "reverse": False,
        "bidirectional": False,
        "training": False,
        "reset_gate_first": False,
        "reset_after": False,
        "flip_z": False,
        "update_gate_activation": A.SIGMOID,
        "reset_gate_activation": A.SIGMOID,
        "output_gate_activation": A.TANH,
    },
}
CLASSES = list(DEFAULTS)
FIELDS = [(c, f) for c in CLASSES for f in DEFAULTS[c]]
FLAG_FIELDS = [(c, f) for c, f in FIELDS if isinstance(DEFAULTS[c][f], bool)]
ACT_FIELDS = [(c, f) for c, f in FIELDS if not isinstance(DEFAULTS[c][f], bool)]
MEMBERS = {"NONE": 0, "RELU": 1, "TANH": 2, "SIGMOID": 3, "HARD_SIGMOID": 4}


def cls_of(name):
    return getattr(rnncore, name)


def field_re(field):
    # \b...\b: "activation" must not be satisfied by "output_gate_activation".
    return r"\b" + re.escape(field) + r"\b"


def other_value(cls_name, field):
    """A value different from the default."""
    default = DEFAULTS[cls_name][field]
    if isinstance(default, bool):
        return not default
    return A.HARD_SIGMOID if default != A.HARD_SIGMOID else A.NONE


def non_default(cls_name):
    """A descriptor with every field changed from its default."""
    return cls_of(cls_name)(**{f: other_value(cls_name, f) for f in DEFAULTS[cls_name]})


def fields_of(d, cls_name):
    return {f: getattr(d, f) for f in DEFAULTS[cls_name]}


# ---- Activation ------------------------------------------------------------------------


def test_activation_members_and_values():
    for name, value in MEMBERS.items():
        member = getattr(A, name)
        assert int(member) == value
        assert member == value
        assert A(value) is member
        assert member.name == name
    assert len(list(A)) == 5
    assert sorted(int(m) for m in A) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("value", [-1, 5, 7])
def test_activation_enum_refuses_other_values(value):
    with pytest.raises(ValueError):
        A(value)


# ---- defaults and fields -------------------------------------------------------------------


@pytest.mark.parametrize("cls_name", CLASSES)
def test_defaults_match_api(cls_name):
    d = cls_of(cls_name)()
    assert fields_of(d, cls_name) == DEFAULTS[cls_name]
    for field, default in DEFAULTS[cls_name].items():
        value = getattr(d, field)
        if isinstance(default, bool):
            assert type(value) is bool, f"{field}: {type(value)}"
        else:
            assert isinstance(value, A), f"{field}: {type(value)}"


@pytest.mark.parametrize("cls_name", CLASSES)
def test_fields_in_documented_order(cls_name):
    assert cls_of(cls_name)._fields == tuple(DEFAULTS[cls_name])


@pytest.mark.parametrize(("cls_name", "field"), FIELDS)
def test_every_field_has_a_one_line_docstring(cls_name, field):
    """help(rnncore.GRUDescriptor.flip_z) says what the field does."""
    doc = getattr(cls_of(cls_name), field).__doc__
    assert doc and doc.strip() and "\n" not in doc.strip(), repr(doc)


def test_activation_members_have_docstrings():
    for member in A:
        assert member.__doc__ and member.name.lower() in member.__doc__


@pytest.mark.parametrize("cls_name", CLASSES)
def test_constructor_is_keyword_only(cls_name):
    with pytest.raises(TypeError):
        cls_of(cls_name)(True)


@pytest.mark.parametrize("cls_name", CLASSES)
def test_constructor_refuses_unknown_fields(cls_name):
    with pytest.raises(TypeError, match="no_such_field"):
        cls_of(cls_name)(no_such_field=True)


@pytest.mark.parametrize(("cls_name", "field"), FIELDS)
def test_constructor_sets_only_its_field(cls_name, field):
    value = other_value(cls_name, field)
    d = cls_of(cls_name)(**{field: value})
    expected = dict(DEFAULTS[cls_name], **{field: value})
    assert fields_of(d, cls_name) == expected


@pytest.mark.parametrize(("cls_name", "field"), FLAG_FIELDS)
def test_flag_round_trip(cls_name, field):
    d = cls_of(cls_name)()
    for value in (True, False, True):
        setattr(d, field, value)
        assert getattr(d, field) is value


@pytest.mark.parametrize(("cls_name", "field"), FLAG_FIELDS)
def test_numpy_bool_is_a_bool(cls_name, field):
    """numpy.bool_ (e.g. from a comparison of arrays) is accepted for a flag."""
    d = cls_of(cls_name)()
    for value in (np.bool_(True), np.bool_(False), np.array(1.0) > 0):
        setattr(d, field, value)
        assert getattr(d, field) is bool(value)
    assert getattr(cls_of(cls_name)(**{field: np.bool_(True)}), field) is True


@pytest.mark.parametrize(("cls_name", "field"), ACT_FIELDS)
def test_activation_round_trip(cls_name, field):
    d = cls_of(cls_name)()
    for name, value in MEMBERS.items():
        member = getattr(A, name)
        for given in (member, value, np.int64(value), np.int32(value)):
            setattr(d, field, given)
            read = getattr(d, field)
            assert isinstance(read, A), f"{field} = {given!r} reads back as {read!r}"
            assert read is member
        assert cls_of(cls_name)(**{field: value}).__getattribute__(field) is member


@pytest.mark.parametrize("cls_name", CLASSES)
def test_fields_are_independent(cls_name):
    d = cls_of(cls_name)()
    for field in DEFAULTS[cls_name]:
        setattr(d, field, other_value(cls_name, field))
    assert d == non_default(cls_name)
    for field, default in DEFAULTS[cls_name].items():
        setattr(d, field, default)
    assert d == cls_of(cls_name)()


# ---- equality ------------------------------------------------------------------------------


@pytest.mark.parametrize("cls_name", CLASSES)
def test_equality(cls_name):
    cls = cls_of(cls_name)
    assert cls() == cls()
    assert not (cls() != cls())
    assert non_default(cls_name) == non_default(cls_name)
    for field in DEFAULTS[cls_name]:
        changed = cls(**{field: other_value(cls_name, field)})
        assert changed != cls(), field
        assert not (changed == cls()), field
    for other in CLASSES:
        if other != cls_name:
            assert cls() != cls_of(other)()


@pytest.mark.parametrize("foreign", [None, 0, "x", object(), {}], ids=repr)
@pytest.mark.parametrize("cls_name", CLASSES)
def test_comparison_with_other_objects_is_false(cls_name, foreign):
    d = cls_of(cls_name)()
    assert d != foreign
    assert not (d == foreign)
    assert foreign != d


# ---- repr ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ["default", "non_default"])
@pytest.mark.parametrize("cls_name", CLASSES)
def test_repr_names_class_and_every_field(cls_name, make):
    d = cls_of(cls_name)() if make == "default" else non_default(cls_name)
    text = repr(d)
    assert text.startswith(cls_name + "("), text
    for field, value in fields_of(d, cls_name).items():
        shown = str(value) if isinstance(value, bool) else r"(Activation\.)?" + value.name
        assert re.search(r"(?<!\w)" + field + r"\s*=\s*" + shown + r"\b", text), (field, text)


@pytest.mark.parametrize("cls_name", CLASSES)
def test_repr_evaluates_back(cls_name):
    d = non_default(cls_name)
    namespace = {cls_name: cls_of(cls_name), "Activation": A, "rnncore": rnncore}
    assert eval(repr(d), namespace) == d


# ---- copy and pickle -------------------------------------------------------------------------


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
@pytest.mark.parametrize("cls_name", CLASSES)
def test_copy_is_equal_and_independent(cls_name, copier):
    d = non_default(cls_name)
    c = copier(d)
    assert type(c) is type(d)
    assert c == d
    assert c is not d
    field = next(iter(DEFAULTS[cls_name]))
    setattr(c, field, DEFAULTS[cls_name][field])
    assert c != d
    assert getattr(d, field) == other_value(cls_name, field)


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("make", ["default", "non_default"])
@pytest.mark.parametrize("cls_name", CLASSES)
def test_pickle_round_trip(cls_name, make, protocol):
    d = cls_of(cls_name)() if make == "default" else non_default(cls_name)
    back = pickle.loads(pickle.dumps(d, protocol=protocol))
    assert type(back) is type(d)
    assert back == d
    assert fields_of(back, cls_name) == fields_of(d, cls_name)
    for field in DEFAULTS[cls_name]:
        value = getattr(back, field)
        assert isinstance(value, (bool, A)) and type(value) is type(getattr(d, field))


# ---- bad values ------------------------------------------------------------------------------

OUT_OF_RANGE = [5, -1, 7, 255, 2**31, -(2**31) - 1, 2**70]
WRONG_TYPE_FOR_ACTIVATION = ["tanh", "TANH", 2.0, 2.5, None, True, False, [2], object()]
WRONG_TYPE_FOR_FLAG = ["yes", "", None, 1.0, [True], object()]


def check_refused(cls_name, field, value, exc):
    """`exc` naming the field, from the constructor and from assignment (unchanged)."""
    cls = cls_of(cls_name)
    with pytest.raises(exc, match=field_re(field)):
        cls(**{field: value})
    d = non_default(cls_name)
    with pytest.raises(exc, match=field_re(field)):
        setattr(d, field, value)
    assert d == non_default(cls_name), "a refused value changed the descriptor"


@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize(("cls_name", "field"), ACT_FIELDS)
def test_out_of_range_activation_is_a_value_error(cls_name, field, value):
    check_refused(cls_name, field, value, ValueError)


@pytest.mark.parametrize("value", WRONG_TYPE_FOR_ACTIVATION, ids=repr)
@pytest.mark.parametrize(("cls_name", "field"), ACT_FIELDS)
def test_activation_of_wrong_type_is_a_type_error(cls_name, field, value):
    check_refused(cls_name, field, value, TypeError)


@pytest.mark.parametrize("value", WRONG_TYPE_FOR_FLAG, ids=repr)
@pytest.mark.parametrize(("cls_name", "field"), FLAG_FIELDS)
def test_flag_of_wrong_type_is_a_type_error(cls_name, field, value):
    check_refused(cls_name, field, value, TypeError)


@pytest.mark.parametrize(("cls_name", "field"), FLAG_FIELDS)
def test_activation_member_for_a_flag_is_a_type_error(cls_name, field):
    """A misplaced activation (an int-like enum) is not silently taken as a bool."""
    check_refused(cls_name, field, A.TANH, TypeError)


@pytest.mark.parametrize("cls_name", CLASSES)
def test_unknown_attribute_cannot_be_set(cls_name):
    d = cls_of(cls_name)()
    with pytest.raises(AttributeError):
        d.no_such_field = True
