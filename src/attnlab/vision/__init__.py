"""Images as sequences (D2L 11.8 (no zh section); Dosovitskiy et al. 2021): the image task of
``model=vit`` and ``model=cnn``, a package of its own so that the translation pipeline neither
imports nor depends on it.

* :mod:`attnlab.vision.vit`: the Vision Transformer (from :mod:`attnlab.models`' encoder
  blocks) and its CNN baseline, in torch alone;
* :mod:`attnlab.vision.data`: the image data sets (scikit-learn's digits; MNIST and CIFAR-10
  through torchvision);
* :mod:`attnlab.vision.lit`: the LightningModule of the classification task;
* :mod:`attnlab.vision.evaluation`: the evaluate stage (test accuracy);
* :mod:`attnlab.vision.export`: the export stage (a ``torch.export`` program).
"""
