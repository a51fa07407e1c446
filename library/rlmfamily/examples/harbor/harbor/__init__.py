"""harbor: ship finished exports from the spool folder to object storage."""

__version__ = "2.7.1"
