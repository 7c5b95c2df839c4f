"""The converters' error: bad input to a checkpoint conversion, raised alike by the HF and Megatron readers
(``hf_io``, ``megatron_reader``) and by the conversions themselves (``convert``, ``reshard``, ``peft_export``)."""


class ConversionError(RuntimeError):
    """Bad converter input (missing files, unknown tensors, inconsistent flags)."""
