"""Type stubs of the kvpool package: everything comes from the _kvpool extension."""
from ._kvpool import *
from ._kvpool import __version__ as __version__
