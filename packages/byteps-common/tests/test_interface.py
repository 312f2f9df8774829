"""Interface version checks between packages."""

import pytest

import byteps.common
import byteps.transport
from byteps.common.interface import InterfaceVersionError, check_interface, require_interface


def test_installed_siblings_satisfy_each_other():
    require_interface("byteps-transport", "byteps.transport", (2, 1), requirer="byteps-common")
    # 3.x: push_pull_async(tensor, name, PushPullOptions); the transport's interface stays 2.x
    assert (byteps.common.INTERFACE_VERSION[0], byteps.transport.INTERFACE_VERSION[0]) == (3, 2)


def test_newer_minor_is_accepted_other_major_is_refused_naming_both():
    check_interface("byteps-transport", (1, 3), (1, 2), "byteps-common")
    with pytest.raises(InterfaceVersionError) as info:
        check_interface("byteps-transport", (2, 0), (1, 0), "byteps-common")
    text = str(info.value)
    assert "needs byteps-transport interface 1.x (>= 1.0)" in text and "provides interface 2.0" in text
    with pytest.raises(InterfaceVersionError, match=r"provides interface 1.1"):
        check_interface("byteps-transport", (1, 1), (1, 2), "byteps-common")


def test_missing_package_says_what_to_install():
    with pytest.raises(InterfaceVersionError, match="pip install byteps-nothing"):
        require_interface("byteps-nothing", "byteps.nothing", (1, 0), requirer="byteps-common")
